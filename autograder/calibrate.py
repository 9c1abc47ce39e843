"""``calibrate``: derive this grading machine's thresholds from what the reference achieves on it.

The reference solutions (the masters' solution cells, :mod:`autograder.reference`) are measured
``runs`` times as ``grade`` measures a student's: their carried code handed to each notebook's
judge (or, where the judge does not decide, its verdict process), which drives it in a worker
and times it from outside (:func:`autograder.verdicts.run`, no sandbox: the code is the course's
own). Measured in one process instead, the bars were set on figures grading never sees (on class
cpu-bf16 the reference's 02 speedup once read 3.4-4.3x there and 2.2-3.8x in the judge, until every
process kept a steady heap, :func:`labsupport.measure.steady_heap`; 04's overhead still reads
0.47-0.51 in the judge against 0.40 in one process). Every check marked ``calibrate = true`` in
thresholds.toml (the speed and memory ratios) gets a bar:

- where higher is better (speedups): ``min(class default, MARGIN x worst run)``; if that is below
  ``SPEEDUP_FLOOR`` the check is "n/a" on this machine, since the reference does not show the
  lesson here and a bar that low would pass a solution that changed nothing;
- where lower is better (shares, byte ratios, overhead): ``max(class default, worst run / MARGIN)``.

So a bar is lowered only as far as this machine needs for the reference to clear it with a
margin, and never raised: the class defaults are the course's bar. A check that is n/a on this
machine's class is not measured (it stays n/a). Correctness checks, the memory budget and counts
are not calibrated. The result goes to ``calibration.toml`` (or ``LAB_CALIBRATION``), which
grading uses on this machine (same device class and device name) at the same profile, and nowhere
else; the table printed compares class defaults with calibrated thresholds. Beside them it records
the baseline's own figures in every usable run (its step time per check, 02's naive loader's data
wait and a batch's crossing: ``[baseline]``), which grading compares a verdict's with
(:data:`autograder.deciding.BASELINE_OFF`): a disturbed baseline holds a pass for review.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import statistics
import tempfile
import tomllib
from pathlib import Path

import pandas as pd

from . import course

MARGIN = 0.85  # the reference must clear a bar by 15% in its worst run
SPEEDUP_FLOOR = 1.10  # below this a "speedup" is within run-to-run noise of no change
JUDGE_TIMEOUT_S = 3600.0  # one notebook's judge, at most (the real profile's take about a minute)


def calibrated_checks(thresholds: Path | None = None) -> dict:
    """The checks of thresholds.toml marked ``calibrate = true``: ``{check id: grading.CheckSpec}``."""
    from labsupport import grading

    return {check: spec for check, spec in grading.check_specs(thresholds).items() if spec.calibrate}


def _usable(row: dict) -> bool:
    """A reference measurement (a verdict file's row) counts when its correctness partner passed.
    In calibration 06's end-to-end check has no ladder of 01-05 to check against (nothing ran
    them here), so that partner alone is excused (``ladder_only``): the measurement itself is the
    same paired comparison. A speed the judge could not protect (no cgroup to freeze a side in:
    "not measured", its figure kept) counts too: the reference's code starts nothing beside itself."""
    if row.get("measured") is None:
        return False
    return row.get("reason") != "incorrect" or bool(row.get("ladder_only"))


def measure(runs: int, where: course.Course | Path = course.COURSE_ROOT, *, only: tuple[str, ...] | None = None,
            progress: bool = True, baselines: dict | None = None) -> tuple[dict[str, list[float]], list[str]]:
    """Run the reference's calibrated checks ``runs`` times: ``({check: [values]}, problems)``.
    ``baselines``, if given, receives the baseline's own figures in each usable run
    (``{check: {figure: [values]}}``, :data:`labsupport.grading.BASELINE_FIGURES`)."""
    from tqdm.auto import tqdm

    from labsupport import grading
    from labsupport import notebooks as registry
    from labsupport.paths import data_root

    from . import batch, reference, verdicts
    from .course import REPO_ROOT

    the = course.of(where)
    wanted = [c for c in calibrated_checks() if only is None or c in only]
    numbers = sorted({registry.of(c).number for c in wanted})
    values: dict[str, list[float]] = {c: [] for c in wanted}
    problems: list[str] = []
    steps = tqdm(total=runs * len(numbers), desc="calibrating", unit="check group", disable=not progress)
    # The reference's code of every notebook, carried forward as a student's would be (05 infers in
    # 03's precision; 06's end-to-end composes 02's loader and 03's step): the kernel's store of a
    # submission's folders, and the grader's, where a judge looks for earlier notebooks' code.
    with tempfile.TemporaryDirectory(prefix="lab-calibrate-") as scratch:
        dirs = batch.Folders(Path(scratch))
        with course.environment({"LAB_RESULTS": str(dirs.results)}):
            reference.keep_all(course_root=the.root)
        shutil.copytree(dirs.results / "code", dirs.store / "code")
        settings = {"profile": os.environ.get("LAB_PROFILE", ""), "thresholds": str(grading.thresholds_path()),
                    "calibration": None, "data": str(data_root().resolve())}
        for run in range(runs):
            for number in numbers:
                steps.set_postfix_str(f"run {run + 1}, notebook {number}")
                ids = tuple(c for c in wanted if registry.of(c).number == number)
                # Each judge starts from nothing an earlier one kept (its checks, rungs, code): the
                # earlier notebooks' code it needs is the reference's, in the grader's store.
                shutil.rmtree(dirs.judged, ignore_errors=True)
                verdict = verdicts.run(number, dirs=dirs, since=0.0, settings=settings, box=None,
                                       pythonpath=REPO_ROOT, timeout_s=JUDGE_TIMEOUT_S)
                for check in ids:
                    row = (verdict.get("checks") or {}).get(check)
                    if row is not None and _usable(row):
                        values[check].append(float(row["measured"]))
                        for figure, value in (row.get("baseline") or {}).items():
                            if baselines is not None:
                                baselines.setdefault(check, {}).setdefault(figure, []).append(float(value))
                    else:
                        problems.append(f"run {run + 1}, {check}: the reference did not produce a usable "
                                        f"measurement ({row['note'] if row else verdict.get('error', 'not run')})")
                steps.update()
    steps.close()
    return values, problems


def class_bar(check: str, spec, device_class: str):
    """``check``'s bar (:func:`labsupport.grading.bar`) on ``device_class`` at its own profile,
    without a calibration: the class default, or n/a and why."""
    from labsupport import grading

    return grading.bar(check, {"device_class": device_class}, None, grading.Bars({check: spec}))


def derive(check: str, spec, device_class: str, values: list[float]) -> tuple[object, str]:
    """This machine's threshold for ``check`` (its ``grading.CheckSpec``) from the reference's runs:
    ``(value or "n/a", why)``. A check n/a on the class stays n/a whatever the reference measures."""
    found = class_bar(check, spec, device_class)
    if not found.applies:
        return "n/a", found.why_na
    if not values:
        return found.threshold, "no usable reference measurement: class default kept"
    default = found.threshold
    if spec.better == "higher":
        worst = min(values)
        bar = round(MARGIN * worst, 2)
        if bar < SPEEDUP_FLOOR:
            return "n/a", (f"the reference reached only {worst:.2f}x in its worst run on this machine; "
                           f"a bar of {bar:.2f}x would not tell an optimisation from noise")
        return (min(default, bar), "class default" if bar >= default else
                f"eased to 85% of the reference's worst run, {worst:.3g}")
    worst = max(values)
    bar = round(worst / MARGIN, 3)
    return (max(default, bar), "class default" if bar <= default else
            f"eased to the reference's worst run / 0.85 ({worst:.3g} / 0.85)")


def _array(values: list[float]) -> str:
    """``values`` as a TOML array, 4 significant digits each."""
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def calibrate(runs: int = 3, where: course.Course | Path = course.COURSE_ROOT, path: Path | None = None, *,
              only: tuple[str, ...] | None = None, progress: bool = True) -> tuple[Path, pd.DataFrame]:
    """Measure the reference ``runs`` times, derive the thresholds, write the calibration file.

    Returns the file's path and the table of class defaults against calibrated thresholds.
    """
    from labsupport.hardware import describe_machine, profile_for

    if runs < 1:
        raise course.CourseError("calibrate needs at least one run (3 or more are recommended).")
    the = course.of(where)
    machine = describe_machine()
    path = Path(path) if path else the.calibration
    specs = calibrated_checks()
    shown = tuple(c for c in specs if only is None or c in only)
    # On class cpu, 03's, 05's (a cold compile) and 06's checks are n/a: not measured.
    measured = tuple(c for c in shown if class_bar(c, specs[c], machine.device_class).applies)
    # Measure with the class defaults, whatever an older calibration file says.
    old = os.environ.get("LAB_CALIBRATION")
    os.environ["LAB_CALIBRATION"] = str(path.with_suffix(".ignored-during-calibration"))
    try:
        baselines: dict[str, dict[str, list[float]]] = {}
        values, problems = measure(runs, the, only=measured, progress=progress, baselines=baselines)
    finally:
        if old is None:
            os.environ.pop("LAB_CALIBRATION", None)
        else:
            os.environ["LAB_CALIBRATION"] = old
    rows, thresholds, reasons = [], {}, {}
    for check in shown:
        vals = values.get(check, [])
        value, why = derive(check, specs[check], machine.device_class, vals)
        thresholds[check] = value
        if value == "n/a":
            reasons[check] = why
        rows.append({"check": check, "better": specs[check].better,
                     "class default": class_bar(check, specs[check], machine.device_class).threshold or "n/a",
                     "reference median": statistics.median(vals) if vals else None,
                     "reference worst": (min(vals) if specs[check].better == "higher" else max(vals))
                     if vals else None,
                     "runs": len(vals), "calibrated": value, "why": why})
    lines = [f"# Thresholds of this grading machine, written by `python -m autograder calibrate` on "
             f"{dt.datetime.now().isoformat(timespec='seconds')}.",
             "# Grading uses them on this machine only (same device class, device name and CPU cores), "
             "at this profile; the rule is in autograder/calibrate.py.",
             "[machine]", f"device_class = {json.dumps(machine.device_class)}",
             f"device_name = {json.dumps(machine.device_name)}", f"cpu_cores = {machine.cpu_cores}", "",
             "[calibration]", f"runs = {runs}", f"profile = {json.dumps(profile_for(machine.profile).name)}",
             f"margin = {MARGIN}", f"speedup_floor = {SPEEDUP_FLOOR}", "", "[thresholds]"]
    lines += [f"{json.dumps(c)} = {json.dumps(v)}" for c, v in thresholds.items()]
    lines += ["", "[na]"] + [f"{json.dumps(c)} = {json.dumps(r)}" for c, r in reasons.items()]
    lines += ["", "[measured]  # every usable run of the reference (none where the class's bar is n/a)"]
    lines += [f"{json.dumps(c)} = {_array(vals)}" for c, vals in values.items()]
    lines += ["", "[baseline]  # the baseline's own figures in those runs (ms): grading holds a pass whose "
              "baseline strays from them (autograder/deciding.py, BASELINE_OFF)"]
    lines += [f"{json.dumps(c)} = {{{', '.join(f'{k} = {_array(vals)}' for k, vals in figs.items())}}}"
              for c, figs in baselines.items()]
    if problems:
        lines += ["", "# problems:"] + [f"#   {p}" for p in problems]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    tomllib.loads(path.read_text())  # what we wrote must read back
    for line in problems:
        print("warning:", line)
    return path, pd.DataFrame(rows).set_index("check")
