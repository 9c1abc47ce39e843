"""A check's bar, decided in one place: :func:`bar`, and the verdict against it, :func:`judge`.

A bar comes from two files, read once where a command starts (:meth:`Bars.read`, or
:meth:`Bars.from_environment` in :func:`labsupport.grading.grading_lab`) and passed down from there:

- ``labsupport/thresholds.toml``: per check, one bar per device class, or ``"n/a"`` with why;
  ``scale`` names the checks the tiny test profile does not grade (its ``[scale]`` says why);
  ``every-class = "rungs"`` is 06's bar, the number of rungs the registry lists.
- a calibration file (``calibrate`` writes it): this machine's bars, at the profile it measured.

:func:`bar` takes the check, the machine, the profile and those :class:`Bars` as arguments and
reads no environment variable. The self-check and the judge reach it through :func:`judge` (the
lab made by ``grading_lab()`` carries its Bars); ``calibrate``, ``benchmark``, ``accept`` and the
grader's recomputation call it directly.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import hardware, notebooks
from .registry import BASELINE_FIGURES, CheckResult

_PACKAGE = Path(__file__).resolve().parent.parent  # labsupport/
_CHECKOUT = _PACKAGE.parent  # the instructor's checkout (its autograder/ holds the calibration)
_NOT_CLASSES = ("what", "better", "calibrate", "na", "scale", "every-class", "fall", "fall-why")


class GradingSetupError(RuntimeError):
    """The thresholds or calibration file is missing or malformed; the message says how to fix it."""


def thresholds_path() -> Path:
    """``LAB_THRESHOLDS``, else the class defaults shipped with labsupport (``thresholds.toml``).
    For the command-line entry points (:meth:`Bars.from_environment`, the grader's batch)."""
    return Path(os.environ.get("LAB_THRESHOLDS", _PACKAGE / "thresholds.toml"))


def calibration_path() -> Path:
    """``LAB_CALIBRATION``, else ``autograder/calibration.toml`` (written by the calibrate command).
    For the command-line entry points, as :func:`thresholds_path`."""
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
    scale: str = ""  # a key of [scale]: the real scale it needs (n/a at a profile that grades no speed)
    fall: float | None = None  # a second bar: the figure must also fall to this fraction of the baseline's
    fall_why: str = ""  # what a miss of it says ({now}, {baseline}, {fall})

    def applies(self, device_class: str) -> bool:
        """Whether the class has a bar: one that is n/a stays n/a whatever the reference measures."""
        return self.defaults.get(device_class) not in (None, "n/a")


def _spec(check: str, spec: dict) -> CheckSpec:
    defaults = {k: v for k, v in spec.items() if k not in _NOT_CLASSES}
    every = spec.get("every-class")
    if every is not None:  # one bar on every class; "rungs": as many as the registry lists
        every = len(notebooks.rungs()) if every == "rungs" else every
        defaults = {cls: every for cls in hardware.DEVICE_CLASSES} | defaults
    return CheckSpec(check, str(spec.get("what", "")), spec["better"], bool(spec.get("calibrate")),
                     defaults, dict(spec.get("na", {})), str(spec.get("scale", "")),
                     None if spec.get("fall") is None else float(spec["fall"]), str(spec.get("fall-why", "")))


@dataclass(frozen=True)
class Bars:
    """What every bar is decided from: thresholds.toml's checks and a calibration file's contents
    (None: no calibration). Made once where a command starts, then passed down."""

    specs: dict[str, CheckSpec]
    scale: dict[str, str] = field(default_factory=dict)  # [scale]: why a test profile skips a check
    calibration: dict | None = None
    thresholds_file: str = ""  # the files' names, for messages
    calibration_file: str = ""

    @classmethod
    def read(cls, thresholds: Path | None = None, calibration: Path | None = None) -> Bars:
        """The bars of ``thresholds`` (default labsupport's thresholds.toml) and ``calibration``
        (a file that may not exist: then none)."""
        thresholds = Path(thresholds) if thresholds else _PACKAGE / "thresholds.toml"
        raw = _read_toml(thresholds, "thresholds")
        specs = {check: _spec(check, spec) for check, spec in raw.get("checks", {}).items()}
        cal = None
        if calibration is not None and Path(calibration).exists():
            cal = _read_toml(Path(calibration), "calibration")
        return cls(specs, dict(raw.get("scale", {})), cal, str(thresholds), str(calibration or ""))

    @classmethod
    def from_environment(cls) -> Bars:
        """``LAB_THRESHOLDS`` and ``LAB_CALIBRATION`` (or their defaults), read here: for the entry
        points only (``grading_lab()``, the grader's own decisions)."""
        return cls.read(thresholds_path(), calibration_path())

    def spec(self, check: str) -> CheckSpec:
        """``check``'s entry, or a GradingSetupError naming the known checks."""
        if check not in self.specs:
            raise GradingSetupError(f"No check named {check!r} in {self.thresholds_file}; "
                                    f"known checks: {', '.join(sorted(self.specs))}.")
        return self.specs[check]


@dataclass(frozen=True)
class Bar:
    """A check's bar on one machine at one profile: what every verdict on it is decided against."""

    threshold: float | None  # None: the check does not apply here
    better: str  # "higher" or "lower"
    why_na: str  # why it does not apply ("" where it does)
    calibrated: bool = False  # from this machine's calibration file, not the class default
    # Where it came from: "default" (the class's), "calibration", or why it is n/a: "class",
    # "calibration" (the reference showed no lesson here), "profile" (a test profile).
    source: str = "default"

    @property
    def applies(self) -> bool:
        return self.threshold is not None


def _profile(machine: dict, profile) -> hardware.Profile:
    """``profile`` (a Profile, a profile's name, or None: the machine's own) as a Profile."""
    if isinstance(profile, hardware.Profile):
        return profile
    return hardware.profile_for(machine.get("profile") or machine["device_class"], profile or "")


def bar(check: str, machine: dict, profile, bars: Bars) -> Bar:
    """The bar for ``check`` on ``machine`` (a Machine's facts) at ``profile`` (a Profile or its
    name; None: the machine's own), from ``bars``. The one place a bar is decided, in this order:

    1. the class: thresholds.toml's bar for the machine's device class, or its "n/a" and why;
    2. the profile: a check that needs the real scale (``scale``) is n/a at a profile that grades
       no speed (the tiny test profile: at 32 px the lesson does not show);
    3. the calibration: this machine's bar, or its "n/a", where ``bars.calibration`` was measured
       on this machine at this profile (:func:`calibration_for`);
    4. else the class default.
    """
    spec, cls = bars.spec(check), machine["device_class"]
    value = spec.defaults.get(cls)
    if value is None:
        raise GradingSetupError(f"{bars.thresholds_file}: check {check!r} has no threshold for "
                                f"device class {cls!r}.")
    if value == "n/a":
        return Bar(None, spec.better, spec.na.get(cls, "not applicable on " + cls), source="class")
    at = _profile(machine, profile)
    if spec.scale and not at.grades_speed:
        why = bars.scale.get(spec.scale, "profile {profile} does not grade this check")
        return Bar(None, spec.better, why.format(profile=at.name), source="profile")
    name = profile.name if isinstance(profile, hardware.Profile) else profile
    cal = calibration_for(bars, machine, name)
    if cal is not None and check in cal.get("thresholds", {}):
        value = cal["thresholds"][check]
        if value == "n/a":  # the reference itself cannot clear a meaningful bar here
            return Bar(None, spec.better, cal.get("na", {}).get(
                check, f"not applicable on this machine (calibration file {bars.calibration_file})"), True,
                "calibration")
        return Bar(float(value), spec.better, "", True, "calibration")
    return Bar(float(value), spec.better, "")


def calibration_for(bars: Bars, machine: dict, profile: str | None = None) -> dict | None:
    """``bars``'s calibration if it was measured on ``machine`` at ``profile`` (default: the
    machine's own), else None.

    A calibration file applies only to the machine it was measured on (:func:`hardware.same_machine`,
    CPU cores included where the file records them: ``grade --jobs`` grades each submission on a
    share of the cores) and at the profile it was measured at (a bar eased for the tiny test
    profile says nothing of the class's own scale).
    """
    cal = bars.calibration
    if cal is None:
        return None
    measured_on = cal.get("machine", {})
    if not hardware.same_machine(measured_on, machine, cores="cpu_cores" in measured_on):
        return None
    at = cal.get("calibration", {}).get("profile")
    if at is not None and at != (profile or machine.get("profile") or at):
        return None
    return cal


def bars_of(lab: hardware.Lab) -> Bars:
    """The Bars ``lab`` carries (``grading_lab()`` makes it with them), or a GradingSetupError."""
    found = getattr(lab, "bars", None)
    if found is None:
        raise GradingSetupError("this lab carries no bars: grade with labsupport.grading.grading_lab()'s "
                                "lab (or GradedLab(..., bars=Bars.read(...))), not ls.setup()'s")
    return found


def lab_bar(check: str, lab: hardware.Lab) -> Bar:
    """:func:`bar` for ``check`` on ``lab``'s machine, at its profile, from the bars it carries."""
    return bar(check, lab.machine.as_dict(), lab.profile, bars_of(lab))


@dataclass(frozen=True)
class GradedLab(hardware.Lab):
    """A lab as the checks see it: with the bars they are decided against."""

    bars: Bars | None = None


def passes(measured: float, threshold: float, better: str) -> bool:
    """Whether ``measured`` is on the right side of ``threshold`` (the judge's and the grader's rule)."""
    return measured >= threshold if better == "higher" else measured <= threshold


def judge(check: str, measured: float | None, lab: hardware.Lab, *, correct: bool = True,
          why_incorrect: str = "", optimised: bool = True, why_not_optimised: str = "",
          note: str = "", details: dict | None = None, fell: tuple[float, float] | None = None) -> CheckResult:
    """Compare a fresh measurement with the bar on ``lab`` (:func:`lab_bar`), after its two partners.

    - ``correct``: the correctness partner. A result that is not correct fails whatever it
      measured, even where the check does not apply: fast but wrong earns nothing, and neither
      does missing code.
    - ``optimised``: the optimisation the check is about is in the student's code, seen directly
      (the model was compiled; the step's data wait fell against the naive loader's, measured
      now). Where speed cannot be graded (n/a) the points then still need the work done, and a
      bar that unoptimised code happens to clear on this machine earns nothing.

    - ``fell``: ``(now, baseline)``, for a check with a second bar (thresholds.toml's ``fall``): the
      figure measured now must also be at most ``fall`` times the baseline's, measured in the same
      check, or the check fails "below bar" (even where the first bar is n/a).

    Where the profile makes the check n/a, ``note`` follows the reason.
    """
    found = _judged(check, measured, lab, correct, why_incorrect, optimised, why_not_optimised, note, details)
    spec = bars_of(lab).spec(check)
    if (fell is not None and spec.fall is not None and found.reason in ("pass", "n/a", "below bar")
            and fell[0] > spec.fall * fell[1]):
        missed = spec.fall_why.format(now=fell[0], baseline=fell[1], fall=spec.fall)
        return replace(found, status="fail", reason="below bar", note=f"{missed}; {note}")
    return found


def _judged(check, measured, lab, correct, why_incorrect, optimised, why_not_optimised, note, details):
    """:func:`judge` on the bar alone."""
    found = lab_bar(check, lab)
    threshold, better = found.threshold, found.better
    cls = lab.machine.device_class
    details = details or {}
    if not correct:  # before n/a: a check that cannot apply here still needs working code
        return CheckResult(check, measured, threshold, better, cls, "fail",
                           f"correctness check failed: {why_incorrect}", details, "incorrect")
    if not optimised:
        return CheckResult(check, measured, threshold, better, cls, "fail",
                           f"not optimised: {why_not_optimised}", details, "not optimised")
    if threshold is None:
        why = f"{found.why_na}; {note}".rstrip("; ") if found.source == "profile" else found.why_na
        return CheckResult(check, measured, None, better, cls, "n/a", why, details)
    if measured is None:
        return CheckResult(check, None, threshold, better, cls, "fail", note or "nothing measured", details,
                           "not measured")
    ok = passes(float(measured), threshold, better)
    return CheckResult(check, float(measured), threshold, better, cls, "pass" if ok else "fail", note,
                       details, "pass" if ok else "below bar")


def speed(lab: hardware.Lab, check: str, measured: float | None, better: str = "higher",
          **partner) -> CheckResult:
    """:func:`judge` for a check that needs the real scale; ``better`` is thresholds.toml's (kept
    for callers that name it). Its ``scale`` in thresholds.toml makes it n/a at the tiny profile."""
    return judge(check, measured, lab, **partner)


# Reading the bars from the environment: for callers outside labsupport that were handed none
# (autograder/deciding.py, tests). Inside labsupport.grading nothing calls these without ``bars``.
def threshold_for(check: str, machine: dict, profile: str | None = None,
                  bars: Bars | None = None) -> tuple[float | None, str, str]:
    """:func:`bar` as ``(threshold or None, better, why-not-applicable)``."""
    found = bar(check, machine, profile, bars or Bars.from_environment())
    return found.threshold, found.better, found.why_na


def check_specs(path: Path | None = None) -> dict[str, CheckSpec]:
    """Every check of thresholds.toml (``path``, default :func:`thresholds_path`), by id."""
    return Bars.read(Path(path) if path else thresholds_path()).specs


def check_spec(check: str) -> CheckSpec:
    """Check ``check``'s entry in thresholds.toml, or a GradingSetupError naming the known checks."""
    return Bars.read(thresholds_path()).spec(check)


def reference_baseline(check: str, machine: dict, profile: str | None = None,
                       bars: Bars | None = None) -> dict[str, list[float]]:
    """The baseline's own figures (:data:`BASELINE_FIGURES`) in ``check``'s runs when ``calibrate``
    measured the reference on ``machine`` at ``profile`` (empty where nothing was calibrated)."""
    cal = calibration_for(bars or Bars.from_environment(), machine, profile) or {}
    figures = cal.get("baseline", {}).get(check, {})
    return {k: [float(v) for v in vals] for k, vals in figures.items() if k in BASELINE_FIGURES and vals}


def reference_runs(check: str, machine: dict, profile: str | None = None, bars: Bars | None = None) -> list[float]:
    """What the reference measured for ``check`` on ``machine`` at ``profile`` when it was
    calibrated (none if it was not calibrated there): the grader holds a result far beyond these
    for a person."""
    cal = calibration_for(bars or Bars.from_environment(), machine, profile) or {}
    return [float(v) for v in cal.get("measured", {}).get(check, [])]
