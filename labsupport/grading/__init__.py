"""Graded checks: measure the student's code against the baseline, in this process, now.

One module per notebook holds its checks (``g01_profile.py`` ... ``g06_report.py``, named after the
notebook's file); :mod:`.partners` holds the correctness partners they share. This module is the
core: thresholds and calibration, verdicts (:func:`judge`), the private labsupport copy graded
checks measure with (:func:`fresh`), and :func:`run`, which runs a notebook's checks.

The grading contract in code:

- A check never reads a number the student typed, printed or saved: it calls the student's
  function and measures it, through a *fresh* copy of labsupport loaded from its source files
  (:func:`fresh`), so a notebook cell that replaced ``ls.measure.compare`` changes nothing.
- Speed is a paired ratio; memory a ratio of bytes. Thresholds come per device class from
  ``labsupport/thresholds.toml``, overridden by a calibration file measured on the grading
  machine.
- Every speed or memory check has a correctness partner; a fast but wrong answer fails.
- A check that cannot apply on this device class says ``n/a`` and why.

Every check returns a :class:`CheckResult`; :func:`table` shows them the way the self-check
prints them (check, measured, threshold, pass/fail). A notebook's graded cells run
``labsupport.grading.fresh().grading.run("02", globals())``.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import sys
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Callable

import pandas as pd

from .. import carry, hardware, measure, notebooks, pipeline

_PACKAGE = Path(__file__).resolve().parent.parent  # labsupport/
_CHECKOUT = _PACKAGE.parent  # the instructor's checkout (its autograder/ holds the calibration)
_fresh_ids = itertools.count()


class GradingSetupError(RuntimeError):
    """The thresholds or calibration file is missing or malformed; the message says how to fix it."""


# What a check's result rests on (CheckResult.reason). "below bar": measured, on the wrong side of
# the bar; "incorrect": its correctness partner failed; "not optimised": the optimisation is not in
# the code; "not measured": nothing to compare; "error": the check (the student's code) raised.
REASONS = ("pass", "n/a", "below bar", "incorrect", "not optimised", "not measured", "error")


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one graded check."""

    check: str  # the check's id in thresholds.toml, e.g. "02-loader-speedup"
    measured: float | None  # what was measured just now (None if the check did not apply or ran)
    threshold: float | None  # the bar on this machine (None if not applicable)
    better: str  # "higher" or "lower"
    device_class: str  # the class whose threshold applied
    status: str  # "pass", "fail" or "n/a"
    note: str = ""  # why it failed or does not apply, including a failed correctness partner
    details: dict = field(default_factory=dict)  # what else was measured (for tables and results)
    # Why, for programs (the grader, calibrate): one of REASONS. Left empty, it follows the status
    # ("pass", "n/a"; a failure is then an "error": the check's code raised).
    reason: str = ""

    def __post_init__(self):
        if not self.reason:
            object.__setattr__(self, "reason", {"pass": "pass", "n/a": "n/a"}.get(self.status, "error"))
        if self.reason not in REASONS:
            raise ValueError(f"{self.check}: reason {self.reason!r} is not one of {REASONS}")

    @property
    def passed(self) -> bool:
        """True when the check passed or does not apply here (its points are then awarded)."""
        return self.status in ("pass", "n/a")

    def require(self) -> None:
        """Raise AssertionError saying what was measured and what to fix, unless passed."""
        if not self.passed:
            measured = "nothing" if self.measured is None else f"{self.measured:.3g}"
            bar = "" if self.threshold is None else \
                f", needs {'>=' if self.better == 'higher' else '<='} {self.threshold:.3g}"
            raise AssertionError(f"{self.check} failed on {self.device_class}: measured {measured}"
                                 f"{bar}. {self.note}")


def thresholds_path() -> Path:
    """``LAB_THRESHOLDS``, else the class defaults shipped with labsupport (``thresholds.toml``)."""
    return Path(os.environ.get("LAB_THRESHOLDS", _PACKAGE / "thresholds.toml"))


# Set by `python -m autograder grade` in every notebook's kernel: the grader's judge measures each
# check afterwards, outside the kernel, on the code carried from it, so the kernel does not measure
# them twice (03's accuracy check alone trains for over two minutes at a real profile).
MEASURED_BY_THE_GRADER = "LAB_GRADER_MEASURES"
DEFERRED_NOTE = ("measured by the grader outside this kernel, on the code carried from here: "
                 "its table opens your feedback")


def calibration_path() -> Path:
    """``LAB_CALIBRATION``, else ``autograder/calibration.toml`` (written by the calibrate command)."""
    return Path(os.environ.get("LAB_CALIBRATION", _CHECKOUT / "autograder" / "calibration.toml"))


def _read_toml(path: Path, what: str) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise GradingSetupError(f"The {what} file {path} does not exist. Reinstall labsupport, "
                                "or set LAB_THRESHOLDS to a thresholds.toml.") from None
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise GradingSetupError(f"The {what} file {path} is not valid TOML ({err}).") from None


@dataclass(frozen=True)
class CheckSpec:
    """One check's entry in thresholds.toml: what it measures and its class defaults."""

    check: str  # its id, e.g. "02-loader-speedup"
    what: str  # what is measured, in words
    better: str  # "higher" or "lower"
    calibrate: bool  # a speed or memory ratio whose bar ``calibrate`` sets per machine
    defaults: dict  # {device class: bar, or "n/a"}
    na: dict  # {device class: why the check does not apply there}

    def applies(self, device_class: str) -> bool:
        """Whether the class has a bar: one that is n/a stays n/a whatever the reference measures."""
        return self.defaults.get(device_class) not in (None, "n/a")


def check_specs(path: Path | None = None) -> dict[str, CheckSpec]:
    """Every check of thresholds.toml (``path``, default :func:`thresholds_path`), by id."""
    path = Path(path) if path else thresholds_path()
    checks = _read_toml(path, "thresholds").get("checks", {})
    return {check: CheckSpec(check, str(spec.get("what", "")), spec["better"], bool(spec.get("calibrate")),
                             {k: v for k, v in spec.items() if k not in ("what", "better", "calibrate", "na")},
                             dict(spec.get("na", {})))
            for check, spec in checks.items()}


def check_spec(check: str) -> CheckSpec:
    """Check ``check``'s entry in thresholds.toml, or a GradingSetupError naming the known checks."""
    specs = check_specs()
    if check not in specs:
        raise GradingSetupError(f"No check named {check!r} in {thresholds_path()}; "
                                f"known checks: {', '.join(sorted(specs))}.")
    return specs[check]


@dataclass(frozen=True)
class Bar:
    """A check's bar on one machine at one profile: what every verdict on it is decided against."""

    threshold: float | None  # None: the check does not apply here
    better: str  # "higher" or "lower"
    why_na: str  # why it does not apply ("" where it does)
    calibrated: bool = False  # from this machine's calibration file, not the class default


def bar(check: str, machine: dict, profile: str | None = None) -> Bar:
    """The bar for ``check`` on ``machine`` (a Machine's facts) at ``profile`` (the name of the
    profile the check ran at; default the machine's own). The one place a bar is decided: the
    self-check and the judge (through :func:`judge`), the grader's recomputation, ``calibrate``,
    ``accept`` and ``make run`` all ask here.

    The class default of thresholds.toml, unless a calibration file measured on this machine at
    this profile (:func:`calibration_for`) says otherwise. Nothing here reads the environment
    but the two files' paths: the profile is the caller's.
    """
    spec, cls = check_spec(check), machine["device_class"]
    value = spec.defaults.get(cls)
    if value is None:
        raise GradingSetupError(f"{thresholds_path()}: check {check!r} has no threshold for "
                                f"device class {cls!r}.")
    if value == "n/a":
        return Bar(None, spec.better, spec.na.get(cls, "not applicable on " + cls))
    cal = calibration_for(machine, profile)
    if cal is not None and check in cal.get("thresholds", {}):
        value = cal["thresholds"][check]
        if value == "n/a":  # the reference itself cannot clear a meaningful bar here
            return Bar(None, spec.better, cal.get("na", {}).get(
                check, f"not applicable on this machine (calibration file {calibration_path()})"), True)
        return Bar(float(value), spec.better, "", True)
    return Bar(float(value), spec.better, "")


def threshold_for(check: str, machine: dict, profile: str | None = None) -> tuple[float | None, str, str]:
    """:func:`bar` as ``(threshold or None, better, why-not-applicable)``."""
    found = bar(check, machine, profile)
    return found.threshold, found.better, found.why_na


def calibration_for(machine: dict, profile: str | None = None) -> dict | None:
    """The calibration file's contents if it was measured on ``machine`` at ``profile`` (default:
    the machine's own), else None.

    A calibration file applies only to the machine it was measured on (:func:`hardware.same_machine`,
    CPU cores included where the file records them: ``grade --jobs`` grades each submission on a
    share of the cores) and at the profile it was measured at (a bar eased for the tiny test
    profile says nothing of the class's own scale).
    """
    calibration = calibration_path()
    if not calibration.exists():
        return None
    cal = _read_toml(calibration, "calibration")
    measured_on = cal.get("machine", {})
    if not hardware.same_machine(measured_on, machine, cores="cpu_cores" in measured_on):
        return None
    at = cal.get("calibration", {}).get("profile")
    if at is not None and at != (profile or machine.get("profile") or at):
        return None
    return cal


def reference_baseline(check: str, machine: dict, profile: str | None = None) -> dict[str, list[float]]:
    """The baseline's own figures (:data:`BASELINE_FIGURES`) in ``check``'s runs when ``calibrate``
    measured the reference on ``machine`` at ``profile`` (empty where nothing was calibrated)."""
    cal = calibration_for(machine, profile) or {}
    figures = cal.get("baseline", {}).get(check, {})
    return {k: [float(v) for v in vals] for k, vals in figures.items() if k in BASELINE_FIGURES and vals}


def reference_runs(check: str, machine: dict, profile: str | None = None) -> list[float]:
    """What the reference measured for ``check`` on ``machine`` at ``profile`` when it was
    calibrated (none if it was not calibrated there): the grader holds a result far beyond these
    for a person."""
    cal = calibration_for(machine, profile) or {}
    return [float(v) for v in cal.get("measured", {}).get(check, [])]


def judge(check: str, measured: float | None, lab: hardware.Lab, *, correct: bool = True,
          why_incorrect: str = "", optimised: bool = True, why_not_optimised: str = "",
          note: str = "", details: dict | None = None) -> CheckResult:
    """Compare a fresh measurement with the bar on ``lab`` (its machine, at its profile:
    :func:`bar`), after its two partners.

    - ``correct``: the correctness partner. A result that is not correct fails whatever it
      measured, even where the check does not apply: fast but wrong earns nothing, and neither
      does missing code.
    - ``optimised``: the optimisation the check is about is in the student's code, seen directly
      (the model was compiled; the step's data wait fell against the naive loader's, measured
      now). Where speed cannot be graded (n/a) the points then still need the work done, and a
      bar that unoptimised code happens to clear on this machine earns nothing.
    """
    found = bar(check, lab.machine.as_dict(), lab.profile.name)
    threshold, better, not_applicable = found.threshold, found.better, found.why_na
    cls = lab.machine.device_class
    details = details or {}
    if not correct:  # before n/a: a check that cannot apply here still needs working code
        return CheckResult(check, measured, threshold, better, cls, "fail",
                           f"correctness check failed: {why_incorrect}", details, "incorrect")
    if not optimised:
        return CheckResult(check, measured, threshold, better, cls, "fail",
                           f"not optimised: {why_not_optimised}", details, "not optimised")
    if threshold is None:
        return CheckResult(check, measured, None, better, cls, "n/a", not_applicable, details)
    if measured is None:
        return CheckResult(check, None, threshold, better, cls, "fail", note or "nothing measured", details,
                           "not measured")
    ok = passes(float(measured), threshold, better)
    return CheckResult(check, float(measured), threshold, better, cls, "pass" if ok else "fail", note,
                       details, "pass" if ok else "below bar")


def passes(measured: float, threshold: float, better: str) -> bool:
    """Whether ``measured`` is on the right side of ``threshold`` (the judge's and the grader's rule)."""
    return measured >= threshold if better == "higher" else measured <= threshold


def fresh() -> ModuleType:
    """A private copy of labsupport, loaded from its source files.

    Graded checks measure with this copy, so a notebook cell that replaced a labsupport function
    (``ls.measure.compare = ...``) cannot change what is measured.
    """
    name = f"_labsupport_graded_{next(_fresh_ids)}"
    package_dir = _PACKAGE
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
    check, measured, threshold, result, note.
    """
    results = fresh().grading.run(notebook, namespace)
    return table(list(results.values()))


def table(results) -> pd.DataFrame:
    """The self-check table: check, measured, threshold, result."""
    results = list(results)

    def shown(r: CheckResult) -> str:
        return "" if r.threshold is None else f"{'>=' if r.better == 'higher' else '<='} {r.threshold:.3g}"

    return pd.DataFrame({
        "check": [r.check for r in results],
        "measured": ["" if r.measured is None else f"{r.measured:.3g}" for r in results],
        "threshold": [shown(r) for r in results],
        "result": [r.status.upper() for r in results],
        "note": [r.note for r in results],
    })


class StudentCodeError(RuntimeError):
    """The student's function is missing or broke its contract; the message says what to fix."""


_CHECKS: dict[str, list[tuple[tuple[str, ...], Callable]]] = {}


def register(*ids: str):
    """Register a check function producing the results ``ids`` for the notebook of ``ids[0]``."""
    def add(fn):
        _CHECKS.setdefault(notebooks.of(ids[0]).number, []).append((ids, fn))
        return fn
    return add


def check_groups(number: str) -> list[tuple[str, ...]]:
    """Notebook ``number``'s checks, in the groups one check function measures together, in order."""
    importlib.import_module(f".{module_name(number)}", __name__)  # registers the notebook's checks
    return [ids for ids, _ in _CHECKS.get(number, [])]


def module_name(number: str) -> str:
    """The module of notebook ``number``'s checks: ``g`` + its file's stem (``g02_data_loading``)."""
    return "g" + Path(notebooks.get(number).file).stem


def student(namespace: dict, name: str, number: str) -> Callable:
    """The student's function ``name`` from the notebook's namespace, or a StudentCodeError."""
    fn = namespace.get(name)
    if not callable(fn):
        raise StudentCodeError(f"`{name}` is not defined: write it in notebook {number}'s solution "
                               "cell and run that cell before the checks.")
    return fn


def carried(number: str, lab) -> object:
    """Notebook ``number``'s graded functions as its checks last measured them (:mod:`labsupport.carry`).

    A StudentCodeError names the notebook to run when they are missing.
    """
    try:
        return carry.load(number, lab=lab)
    except carry.CarryError as err:
        raise StudentCodeError(str(err)) from None


def grading_lab() -> hardware.Lab:
    """This machine's device, description and profile, as the checks see them (seed 0)."""
    device = hardware.pick_device()
    machine = hardware.describe_machine(device)
    return hardware.Lab(device, machine, hardware.profile_for(machine.profile), seed=0)


def speed(lab: hardware.Lab, check: str, measured: float | None, better: str = "higher",
          **partner) -> CheckResult:
    """judge() for a check that needs the real scale (speed, a step's peak), which the tiny test
    profile never grades: at 32 px the lesson does not show (a step's peak is its gradients)."""
    if not lab.profile.grades_speed and partner.get("correct", True) and partner.get("optimised", True):
        return CheckResult(check, measured, None, better, lab.machine.device_class, "n/a",
                           f"profile {lab.profile.name} is for tests and does not grade speed or "
                           f"peaks; {partner.get('note', '')}".rstrip("; "), partner.get("details") or {})
    return judge(check, measured, lab, **partner)


def one_batch(lab: hardware.Lab, batch_size: int | None = None, image_size: int | None = None, seed: int = 0,
              augment: bool = True):
    """The naive loader's first batch at the profile's (or the given) size: ``(images, labels)`` on the
    CPU. Without ``augment`` it is the same batch in every process (augmentation draws from torch's
    global generator)."""
    import dataclasses

    profile = dataclasses.replace(lab.profile, batch_size=batch_size or lab.profile.batch_size,
                                  image_size=image_size or lab.profile.image_size)
    return next(iter(pipeline.naive_loader(profile, seed=seed, augment=augment)))


def process_start_s() -> float | None:
    """When this kernel started (for "written by this kernel" checks), or None without psutil.

    In the grader's verdict process, the kernel's start comes from ``LAB_WRITTEN_SINCE`` (the
    grader sets it; the files checked were written by the kernel that ran before it)."""
    if os.environ.get("LAB_WRITTEN_SINCE"):
        return float(os.environ["LAB_WRITTEN_SINCE"])
    try:
        import psutil
        return psutil.Process().create_time()
    except Exception:  # no psutil: the freshness test is skipped, the content test still runs
        return None


def written_now(path: Path, cell: str) -> Path:
    """``path``, checked to exist and to have been written by this kernel; else a StudentCodeError
    naming ``cell``, the cell that writes it."""
    if not path.is_file():
        raise StudentCodeError(f"{path} does not exist: run {cell}, which writes it.")
    started = process_start_s()
    if started is not None and path.stat().st_mtime < started - 1:
        raise StudentCodeError(f"{path} is older than this kernel: run {cell} again.")
    return path


def run(number: str, namespace: dict, *, only: tuple[str, ...] | None = None,
        skip: tuple[str, ...] = (), lab: hardware.Lab | None = None, keep: bool = True,
        tampered: str = "", sides=None) -> dict[str, CheckResult]:
    """Run notebook ``number``'s graded checks on the code in ``namespace``.

    Returns ``{check id: CheckResult}``. A check whose code raised fails with the error as its
    note; the other checks still run. ``only`` / ``skip`` select checks by id (a notebook may
    grade an expensive check where it is taught, and the rest at the end). With ``keep``, the
    notebook's graded functions, as just measured, are kept for later notebooks (:mod:`labsupport.carry`).
    ``tampered`` (why the code cannot be measured) fails every check with that note, unrun.
    ``sides`` is the grader's judge (:mod:`.judging`): the student's code and the baseline each in a
    worker of its own, passed to the checks that take it; None runs both here. In a kernel the
    grader runs (:data:`MEASURED_BY_THE_GRADER`), the checks are not measured here but "n/a", with a
    note saying where they are: the code is still carried forward, for the grader to measure.
    """
    nb = notebooks.get(number)
    importlib.import_module(f".{module_name(number)}", __name__)  # registers the notebook's checks
    lab = lab or grading_lab()
    out: dict[str, CheckResult] = {}
    libraries = library_functions()
    deferred = (sides is None and namespace.get("__name__") == "__main__"
                and os.environ.get(MEASURED_BY_THE_GRADER) == "1")
    for ids, fn in _CHECKS.get(number, []):
        if (only is not None and not set(ids) & set(only)) or set(ids) <= set(skip):
            continue
        if deferred:
            out.update({i: CheckResult(i, None, None, "", lab.machine.device_class, "n/a", DEFERRED_NOTE) for i in ids})
            continue
        try:
            if tampered:  # the code was caught bending what measures it before any check ran
                raise StudentCodeError(tampered)
            found = fn(namespace, lab) if sides is None else fn(namespace, lab, sides=sides)
        except measure.Disturbed as err:  # the side not timed ran meanwhile: nothing measured counts
            found = [CheckResult(i, None, None, "", lab.machine.device_class, "fail", str(err), reason="not measured")
                     for i in ids]
        except Exception as err:  # the student's code, whatever it raised, costs this check only
            why = f"{type(err).__name__}: {err}"
            found = [CheckResult(i, None, None, "", lab.machine.device_class, "fail", why) for i in ids]
        patched = restore_library_functions(libraries)
        if sides is not None:  # and what it replaced in its worker, where the grader's judge drives it
            patched += sides.guard()
        if patched:  # measured against a patched library (a slowed baseline, a faked clock): no verdict
            why = patched_note(patched, "while it was measured")
            found = [CheckResult(i, None, None, "", lab.machine.device_class, "fail", why) for i in ids]
        out.update({r.check: r for r in found})
    if keep and any(name in namespace for name in nb.graded):
        try:
            carry.keep(number, namespace)
        except carry.CarryError as err:
            if namespace.get("__name__") == "__main__":
                # In a notebook's kernel: later notebooks and the grader run the code carried from
                # here, so what cannot be carried fails here too, saying why, not as a zero there.
                why = f"later notebooks and the grader run your code as it is carried forward, and it cannot be: {err}"
                out = {c: replace(r, status="fail", reason="error", note=why) for c, r in out.items()}
    if keep:
        keep_checks(number, out.values())
    return out


# What the baseline, the clocks and the judge run: the module functions and the methods of the
# classes a graded measurement goes through, which the libraries themselves leave alone once
# imported, and labsupport's own modules and the classes defined in them (their partners' methods).
# (Not torch.nn.Module or the optimizers: torch.compile and torch.optim patch those on their own.)
# A graded function that replaces one, or swaps its code or defaults in place, to slow the naive
# loader or step it is compared with, fake a clock or bend the judge, fails the check it was
# measured in; carried code that does so when it is loaded fails every check of its notebook.
_LIBRARY_MODULES = ("time", "torch", "torch.nn.functional", "torch.utils.data",
                    "torchvision.transforms.v2.functional", "torchvision.io", "PIL.Image", "numpy",
                    "builtins", "json", "os")
_LIBRARY_CLASSES = (("torch", "Tensor"), ("torch.nn", "Conv2d"), ("torch.nn", "BatchNorm2d"),
                    ("torch.nn", "Linear"), ("torch.utils.data", "DataLoader"), ("PIL.Image", "Image"),
                    ("pathlib", "Path"))
# IPython rebinds these builtins itself (the last results shown), whatever the student's code does.
_REBOUND_BY_IPYTHON = {"_", "__", "___"}
_LABSUPPORT = __name__.rpartition(".")[0]  # "labsupport", or a fresh() copy's private name


def _insides(value) -> tuple:
    """What a Python function runs with, besides its identity: its code and defaults (a replaced
    ``__code__`` keeps the function object, and so would pass an identity check). Closure cells
    are left out: some libraries' closures hold state that changes as they run."""
    if isinstance(value, property):
        return tuple(_insides(f) for f in (value.fget, value.fset, value.fdel))
    fn = getattr(value, "__func__", value)  # staticmethod, classmethod
    if not hasattr(fn, "__code__"):
        return ()
    return (fn.__code__, fn.__defaults__, fn.__kwdefaults__)


def _same(a: tuple, b: tuple) -> bool:
    """The same insides, object for object (defaults may hold tensors, which ``==`` cannot compare)."""
    return len(a) == len(b) and all(_same(x, y) if type(x) is tuple and type(y) is tuple else x is y
                                    for x, y in zip(a, b))


def _watched(value) -> bool:
    return callable(value) or isinstance(value, (staticmethod, classmethod, property))


def library_functions() -> dict[tuple[object, str], tuple[object, tuple]]:
    """``{(module or class, attribute): (function, its insides)}`` for the watched libraries, as they
    are now: the ones above, every module of this labsupport (its baseline, clocks, judge,
    partners) and every class defined in one (their methods and properties)."""
    owners = [sys.modules[m] for m in _LIBRARY_MODULES if m in sys.modules]
    mine = [module for name, module in list(sys.modules.items())
            if name == _LABSUPPORT or name.startswith(_LABSUPPORT + ".")]
    owners += mine
    owners += [value for module in mine for value in list(vars(module).values())
               if isinstance(value, type) and value.__module__ == module.__name__]
    owners += [getattr(sys.modules[m], c) for m, c in _LIBRARY_CLASSES
               if m in sys.modules and hasattr(sys.modules[m], c)]
    return {(owner, name): (value, _insides(value)) for owner in owners for name, value in list(vars(owner).items())
            if _watched(value) and not (owner is sys.modules["builtins"] and name in _REBOUND_BY_IPYTHON)}


def _put_back(value, insides: tuple) -> None:
    """Give function ``value`` back the code and defaults ``insides`` recorded."""
    if isinstance(value, property):
        for f, inner in zip((value.fget, value.fset, value.fdel), insides):
            if f is not None:
                _put_back(f, inner)
        return
    fn = getattr(value, "__func__", value)
    if not insides or not hasattr(fn, "__code__"):
        return
    fn.__code__, fn.__defaults__, fn.__kwdefaults__ = insides


def restore_library_functions(before: dict[tuple[object, str], tuple[object, tuple]]) -> list[str]:
    """Put back every watched function replaced, or changed inside, since ``before``; returns their names."""
    patched = []
    for (owner, name), (value, insides) in before.items():
        now = vars(owner).get(name)
        if now is value and _same(_insides(value), insides):
            continue
        patched.append(f"{getattr(owner, '__module__', '')}.{getattr(owner, '__qualname__', owner.__name__)}"
                       f".{name}" if isinstance(owner, type) else f"{owner.__name__}.{name}")
        try:
            if now is not value:
                setattr(owner, name, value)
            _put_back(value, insides)
        except (AttributeError, TypeError, ValueError):
            pass
    return patched


def patched_note(patched: list[str], when: str) -> str:
    """Why what was measured with ``patched`` library functions in place gets no verdict (``when``:
    "when it was loaded" fails every check of the notebook, "while it was measured" the check)."""
    return (f"your code replaced {', '.join(patched[:3])} {when}: graded code must not patch "
            "libraries or labsupport (the originals are back)")


# What a check that compares the student's code with the baseline says of the baseline's own timing
# (its details): its step (ms per timed call, :meth:`labsupport.measure.Comparison.summary`), 02's
# naive loader's data wait, and a batch's crossing from a worker. ``calibrate`` records what the
# reference's runs measured; the grader holds a pass whose baseline strays far from it for review.
BASELINE_FIGURES = ("baseline_step_ms", "baseline_wait_ms", "crossing_ms")


def with_baseline(result: CheckResult, **figures: float) -> CheckResult:
    """``result`` with the baseline's own ``figures`` (:data:`BASELINE_FIGURES`) in its details."""
    assert set(figures) <= set(BASELINE_FIGURES), figures
    return replace(result, details={**result.details, **{k: float(v) for k, v in figures.items()}})


def verdict_rows(found: dict) -> dict[str, dict]:
    """The checks of a verdict file (the judge's and a verdict process's alike): per check its
    status, reason, measurement, bar and note, whether only 06's ladder partner failed it
    (``calibrate`` still counts that measurement: nothing ran 01-05 there), and the baseline's own
    figures (:data:`BASELINE_FIGURES`)."""
    return {c: {"status": r.status, "reason": r.reason, "measured": r.measured, "threshold": r.threshold,
                "note": r.note, "ladder_only": bool(r.details.get("only_the_ladder_incomplete")),
                "baseline": {k: r.details[k] for k in BASELINE_FIGURES if k in r.details}}
            for c, r in found.items()}


def keep_checks(number: str, found) -> Path:
    """Write notebook ``number``'s checks, as just measured, to ``<results>/checks/<NN>.json``: the
    table's rows and each check's reason (:data:`REASONS`). A notebook that grades its checks in
    two calls (03: the accuracy where it is taught, the rest at the end) keeps both: rows of checks
    not measured now stay."""
    import json

    from .. import results

    folder = results.results_dir() / "checks"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{number}.json"
    found = list(found)
    now = [{**row, "reason": r.reason} for row, r in zip(table(found).to_dict(orient="records"), found)]
    try:
        before = [row for row in json.loads(path.read_text()) if row["check"] not in {r.check for r in found}]
    except (OSError, ValueError, TypeError, KeyError):
        before = []
    order = [c for ids in check_groups(number) for c in ids]  # the notebook's own order
    rows = sorted(before + now, key=lambda row: order.index(row["check"]) if row["check"] in order else len(order))
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rows, indent=1))
    tmp.replace(path)
    return path


def kept_checks(directory: Path | None = None) -> pd.DataFrame:
    """Every notebook's kept checks table, one row per check, in notebook order."""
    import json

    from .. import results

    folder = Path(directory) if directory else results.results_dir()
    rows = []
    for path in sorted((folder / "checks").glob("*.json")):
        try:
            rows += json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # an unreadable table is left out of the report, not raised
    return pd.DataFrame(rows, columns=["check", "measured", "threshold", "result", "note"])


from . import partners  # noqa: E402  (the correctness partners, also reachable from here)

same_batches, same_epoch_labels = partners.same_batches, partners.same_epoch_labels
step_trains, first_mismatch = partners.step_trains, partners.first_mismatch
