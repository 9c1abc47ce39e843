"""Graded checks: measure the student's code against the baseline, in this process, now.

The grading contract (``../shared/design.md``) in code:

- A check never reads a number the student typed, printed or saved: it calls the student's
  function and measures it, through a *fresh* copy of labsupport loaded from its source files
  (:func:`fresh`), so a notebook cell that replaced ``ls.measure.compare`` changes nothing.
- Speed is a paired ratio; memory a ratio of bytes. Thresholds come per device class from
  ``autograder/thresholds.toml``, overridden by a calibration file measured on the grading
  machine.
- Every speed or memory check has a correctness partner; a fast but wrong answer fails.
- A check that cannot apply on this device class says ``n/a`` and why.

Every check returns a :class:`CheckResult`; :func:`table` shows them the way the self-check
prints them (check, measured, threshold, pass/fail).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pandas as pd
import torch

_CHECKOUT = Path(__file__).resolve().parent.parent
_fresh_ids = itertools.count()


class GradingSetupError(RuntimeError):
    """The thresholds or calibration file is missing or malformed; the message says how to fix it."""


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one graded check (Used by: every notebook's self-check and test cells)."""

    check: str  # the check's id in thresholds.toml, e.g. "02-loader-speedup"
    measured: float | None  # what was measured just now (None if the check did not apply or ran)
    threshold: float | None  # the bar on this machine (None if not applicable)
    better: str  # "higher" or "lower"
    device_class: str  # the class whose threshold applied
    status: str  # "pass", "fail" or "n/a"
    note: str = ""  # why it failed or does not apply, including a failed correctness partner
    details: dict = field(default_factory=dict)  # what else was measured (for tables and results)

    @property
    def passed(self) -> bool:
        """True when the check passed or does not apply here (its points are then awarded)."""
        return self.status in ("pass", "n/a")

    def require(self) -> None:
        """Raise AssertionError saying what was measured and what to fix, unless passed (Used by: test cells)."""
        if not self.passed:
            measured = "nothing" if self.measured is None else f"{self.measured:.3g}"
            bar = "" if self.threshold is None else \
                f", needs {'>=' if self.better == 'higher' else '<='} {self.threshold:.3g}"
            raise AssertionError(f"{self.check} failed on {self.device_class}: measured {measured}"
                                 f"{bar}. {self.note}")


def thresholds_path() -> Path:
    """``LAB_THRESHOLDS``, else ``autograder/thresholds.toml`` in the lab's checkout."""
    return Path(os.environ.get("LAB_THRESHOLDS", _CHECKOUT / "autograder" / "thresholds.toml"))


def calibration_path() -> Path:
    """``LAB_CALIBRATION``, else ``autograder/calibration.toml`` (written by the calibrate command)."""
    return Path(os.environ.get("LAB_CALIBRATION", _CHECKOUT / "autograder" / "calibration.toml"))


def _read_toml(path: Path, what: str) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise GradingSetupError(f"The {what} file {path} does not exist. Run from a checkout of "
                                "the lab, or set LAB_THRESHOLDS to its thresholds.toml.") from None
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise GradingSetupError(f"The {what} file {path} is not valid TOML ({err}).") from None


def threshold_for(check: str, machine: dict) -> tuple[float | None, str, str]:
    """The bar for ``check`` on ``machine``: ``(threshold or None, better, why-not-applicable)``.

    A calibration file applies only to the machine it was measured on (same device class and
    device name); anywhere else the class defaults apply.
    """
    checks = _read_toml(thresholds_path(), "thresholds").get("checks", {})
    if check not in checks:
        raise GradingSetupError(f"No check named {check!r} in {thresholds_path()}; "
                                f"known checks: {', '.join(sorted(checks))}.")
    spec, cls = checks[check], machine["device_class"]
    value = spec.get(cls)
    if value is None:
        raise GradingSetupError(f"{thresholds_path()}: check {check!r} has no threshold for "
                                f"device class {cls!r}.")
    if value == "n/a":
        return None, spec["better"], spec.get("na", {}).get(cls, "not applicable on " + cls)
    calibration = calibration_path()
    if calibration.exists():
        cal = _read_toml(calibration, "calibration")
        same = {k: cal.get("machine", {}).get(k) for k in ("device_class", "device_name")} == \
               {k: machine.get(k) for k in ("device_class", "device_name")}
        if same and check in cal.get("thresholds", {}):
            value = cal["thresholds"][check]
            if value == "n/a":  # the reference itself cannot clear a meaningful bar here
                return None, spec["better"], cal.get("na", {}).get(
                    check, f"not applicable on this machine (calibration file {calibration})")
    return float(value), spec["better"], ""


def judge(check: str, measured: float | None, machine: dict, *, correct: bool = True,
          why_incorrect: str = "", optimised: bool = True, why_not_optimised: str = "",
          note: str = "", details: dict | None = None) -> CheckResult:
    """Compare a fresh measurement with this machine's threshold, after its two partners.

    - ``correct``: the correctness partner. A result that is not correct fails whatever it
      measured, even where the check does not apply: fast but wrong earns nothing, and neither
      does missing code.
    - ``optimised``: the optimisation the check is about is in the student's code, seen directly
      (the model was compiled; the step's data wait fell against the naive loader's, measured
      now). Where speed cannot be graded (n/a) the points then still need the work done, and a
      bar that unoptimised code happens to clear on this machine earns nothing.
    """
    threshold, better, not_applicable = threshold_for(check, machine)
    cls = machine["device_class"]
    details = details or {}
    if not correct:  # before n/a: a check that cannot apply here still needs working code
        return CheckResult(check, measured, threshold, better, cls, "fail",
                           f"correctness check failed: {why_incorrect}", details)
    if not optimised:
        return CheckResult(check, measured, threshold, better, cls, "fail",
                           f"not optimised: {why_not_optimised}", details)
    if threshold is None:
        return CheckResult(check, measured, None, better, cls, "n/a", not_applicable, details)
    if measured is None:
        return CheckResult(check, None, threshold, better, cls, "fail", note or "nothing measured", details)
    ok = measured >= threshold if better == "higher" else measured <= threshold
    return CheckResult(check, float(measured), threshold, better, cls, "pass" if ok else "fail", note,
                       details)


def fresh() -> ModuleType:
    """A private copy of labsupport, loaded from its source files (Used by: every graded check).

    Graded checks measure with this copy, so a notebook cell that replaced a labsupport function
    (``ls.measure.compare = ...``) cannot change what is measured.
    """
    name = f"_labsupport_graded_{next(_fresh_ids)}"
    package_dir = Path(__file__).resolve().parent
    spec = importlib.util.spec_from_file_location(
        name, package_dir / "__init__.py", submodule_search_locations=[str(package_dir)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the package's relative imports resolve through sys.modules
    spec.loader.exec_module(module)
    return module


def check(notebook: str, namespace: dict) -> pd.DataFrame:
    """The self-check: run notebook ``notebook``'s graded checks now, as the autograder will.

    Call ``ls.check("02", globals())`` in a notebook (it works in Colab, where nbgrader's Validate
    button is absent). It measures with a fresh copy of labsupport and returns the table:
    check, measured, threshold, result, note. Used by: the last section of 01-06.
    """
    results = fresh().checks.run(notebook, namespace)
    return table(list(results.values()))


def table(results) -> pd.DataFrame:
    """The self-check table: check, measured, threshold, result (Used by: ``check`` in 01-06)."""
    results = list(results)
    def bar(r: CheckResult) -> str:
        return "" if r.threshold is None else f"{'>=' if r.better == 'higher' else '<='} {r.threshold:.3g}"

    return pd.DataFrame({
        "check": [r.check for r in results],
        "measured": ["" if r.measured is None else f"{r.measured:.3g}" for r in results],
        "threshold": [bar(r) for r in results],
        "result": [r.status.upper() for r in results],
        "note": [r.note for r in results],
    })


# Correctness partners: each returns (ok, why-not) so a check can report what to fix.

def same_batches(reference, candidate, max_batches: int | None = None) -> tuple[bool, str]:
    """True if two loaders yield identical images and labels, batch for batch (augmentation off).

    Used by: the 02 loader check (a fast loader must deliver the naive loader's data).
    """
    ref_it, cand_it = iter(reference), iter(candidate)
    for i in itertools.count():
        if max_batches is not None and i >= max_batches:
            return True, ""
        ref, cand = next(ref_it, None), next(cand_it, None)
        if ref is None or cand is None:
            if ref is cand:
                return True, ""
            return False, (f"your loader {'ended' if cand is None else 'went on'} at batch {i}, "
                           f"where the naive loader {'went on' if cand is None else 'ended'}")
        (ref_x, ref_y), (cand_x, cand_y) = ref, cand
        cand_x = cand_x.to("cpu", torch.float32).contiguous()
        if cand_x.shape != ref_x.shape or not torch.equal(cand_y.cpu(), ref_y):
            return False, (f"batch {i}: images {tuple(cand_x.shape)} / labels differ from the "
                           f"naive loader's {tuple(ref_x.shape)}")
        err = (cand_x - ref_x).abs().max().item()
        if err > 1e-5:
            return False, f"batch {i}: pixel values differ from the naive loader's by up to {err:.3g}"


def same_epoch_labels(expected, seen, batch_size: int) -> tuple[bool, str]:
    """True if one epoch saw every sample's label once, up to a dropped last partial batch.

    Used by: the 02 loader check (an augmenting, shuffling loader must still see every sample).
    """
    expected = torch.as_tensor(expected).flatten()
    seen = torch.as_tensor(seen).flatten()
    n_classes = int(max(expected.max(), seen.max() if seen.numel() else 0)) + 1
    missing = torch.bincount(expected, minlength=n_classes) - torch.bincount(seen, minlength=n_classes)
    if (missing < 0).any():
        return False, f"labels seen more often than the dataset holds them: {(-missing).clamp(min=0).tolist()}"
    if missing.sum() >= batch_size:
        return False, (f"one epoch saw {seen.numel()} of {expected.numel()} samples; more than a "
                       f"partial last batch ({batch_size - 1}) is missing")
    return True, ""


def step_trains(step, images, labels, steps: int = 3) -> tuple[bool, str]:
    """True if calling ``step(images, labels)`` a few times changes the weights, all finite.

    Catches a step that skips backward or the optimizer, and an fp16 step without a scaler whose
    overflowing gradients write inf/NaN into the weights. Used by: the 03 and 04 checks.
    """
    params = [p for p in step.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    for i in range(steps):
        loss = step(images, labels)
        if not torch.isfinite(torch.as_tensor(loss)).all():
            return False, f"step {i} returned a non-finite loss ({float(loss)})"
    if not all(torch.isfinite(p).all() for p in params):
        return False, "inf/NaN values were written into the weights (fp16 without a GradScaler?)"
    if all(torch.equal(p, b) for p, b in zip(params, before)):
        return False, f"the weights did not change in {steps} steps: is backward or optimizer.step() skipped?"
    return True, ""
