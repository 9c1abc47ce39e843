"""``calibrate``: derive this grading machine's thresholds from what the reference achieves on it.

The reference solutions (the masters' solution cells) are run through the same graded checks the
notebooks run, ``runs`` times in this process, each time with a fresh copy of labsupport. Every
check marked ``calibrate = true`` in thresholds.toml (the speed and memory ratios) gets a bar:

- where higher is better (speedups): ``min(class default, MARGIN x worst run)``; if that is below
  ``SPEEDUP_FLOOR`` the check is "n/a" on this machine, since the reference does not show the
  lesson here and a bar that low would pass a solution that changed nothing;
- where lower is better (shares, byte ratios, overhead): ``max(class default, worst run / MARGIN)``.

So a bar is lowered only as far as this machine needs for the reference to clear it with a
margin, and never raised: the class defaults are the course's bar. Correctness checks, the
memory budget and counts are not calibrated. The result goes to ``calibration.toml`` (or
``LAB_CALIBRATION``), which grading uses on this machine (same device class and device name) and
nowhere else; the table printed compares class defaults with calibrated thresholds.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import tomllib
from pathlib import Path

import nbformat
import pandas as pd

from . import course

MARGIN = 0.85  # the reference must clear a bar by 15% in its worst run
SPEEDUP_FLOOR = 1.10  # below this a "speedup" is within run-to-run noise of no change


def calibrated_checks(thresholds: Path | None = None) -> dict[str, dict]:
    """The checks of thresholds.toml marked ``calibrate = true``: ``{check id: spec}``."""
    from labsupport import grading

    path = Path(thresholds) if thresholds else grading.thresholds_path()
    checks = tomllib.loads(path.read_text())["checks"]
    return {check: spec for check, spec in checks.items() if spec.get("calibrate")}


def reference_namespace(notebook: str, course_root: Path = course.COURSE_ROOT,
                        cell_ids: tuple[str, ...] | None = None) -> dict:
    """A namespace holding a master's solution code cells (or the cells ``cell_ids``), executed.

    The names a notebook's setup cell provides (``ls``, ``torch``, ``F``, ``pd``, ``lab``) are
    there first, so the solutions run as they do in the notebook. Used by: calibrate and
    tests/test_checks.py (the reference answers the checks are tested against).
    """
    import torch

    import labsupport as ls
    from labsupport import checks

    master = next((p for p in course.masters(course_root) if p.name.startswith(f"{notebook}_")), None)
    if master is None:
        raise course.CourseError(f"No master notebook {notebook}_*.ipynb in the course.")
    nb = nbformat.read(master, as_version=4)
    namespace = {"ls": ls, "torch": torch, "F": torch.nn.functional, "pd": pd, "lab": checks._lab()}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        wanted = cell.get("id") in cell_ids if cell_ids is not None else \
            (cell.cell_type == "code" and meta.get("solution"))
        if wanted:
            exec(compile(cell.source, f"{master.name}:{cell.get('id')}", "exec"), namespace)
    return namespace


# The cells each notebook's calibrated checks need from its master (the functions they grade).
_SOLUTION_CELLS = {"02": ("make_fast_loader",), "03": ("choose_precision", "amp_train_step"),
                   "04": ("checkpointed", "accumulate_step"), "05": ("compile_inference", "break_even_steps"),
                   "06": ("assemble_ladder",)}


def _usable(result) -> bool:
    """A reference measurement counts when its correctness partner passed. In calibration 06's
    end-to-end check has no ladder of 01-05 to check against (nothing ran them here), so that
    partner alone is excused: the measurement itself is the same paired comparison."""
    if result.measured is None:
        return False
    if result.note.startswith("correctness check failed:"):
        return result.note.startswith("correctness check failed: the ladder is incomplete")
    return True


def measure(runs: int, course_root: Path = course.COURSE_ROOT, *, only: tuple[str, ...] | None = None,
            progress: bool = True) -> tuple[dict[str, list[float]], list[str]]:
    """Run the reference's calibrated checks ``runs`` times: ``({check: [values]}, problems)``."""
    from tqdm.auto import tqdm

    from labsupport import grading

    wanted = [c for c in calibrated_checks() if only is None or c in only]
    notebooks = sorted({c[:2] for c in wanted})
    values: dict[str, list[float]] = {c: [] for c in wanted}
    problems = []
    steps = tqdm(total=runs * len(notebooks), desc="calibrating", unit="check group", disable=not progress)
    for run in range(runs):
        for notebook in notebooks:
            steps.set_postfix_str(f"run {run + 1}, notebook {notebook}")
            namespace = reference_namespace(notebook, course_root, _SOLUTION_CELLS.get(notebook, ()))
            ids = tuple(c for c in wanted if c.startswith(notebook))
            found = grading.fresh().checks.run(notebook, namespace, only=ids)
            for check in ids:
                result = found.get(check)
                if result is not None and _usable(result):
                    values[check].append(float(result.measured))
                else:
                    problems.append(f"run {run + 1}, {check}: the reference did not produce a "
                                    f"usable measurement ({result.note if result else 'not run'})")
            steps.update()
    steps.close()
    return values, problems


def derive(check: str, spec: dict, device_class: str, values: list[float]) -> tuple[object, str]:
    """This machine's threshold for ``check`` from the reference's runs: ``(value or "n/a", why)``."""
    default = spec.get(device_class)
    if default in (None, "n/a"):
        return "n/a", spec.get("na", {}).get(device_class, f"not applicable on {device_class}")
    if not values:
        return float(default), "no usable reference measurement: class default kept"
    default = float(default)
    if spec["better"] == "higher":
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


def calibrate(runs: int = 3, course_root: Path = course.COURSE_ROOT, path: Path | None = None, *,
              only: tuple[str, ...] | None = None, progress: bool = True) -> tuple[Path, pd.DataFrame]:
    """Measure the reference ``runs`` times, derive the thresholds, write the calibration file.

    Returns the file's path and the table of class defaults against calibrated thresholds.
    """
    from labsupport.hardware import describe_machine, profile_for

    if runs < 1:
        raise course.CourseError("calibrate needs at least one run (3 or more are recommended).")
    machine = describe_machine()
    path = Path(path) if path else course.calibration_file(course_root)
    # Measure with the class defaults, whatever an older calibration file says.
    old = os.environ.get("LAB_CALIBRATION")
    os.environ["LAB_CALIBRATION"] = str(path.with_suffix(".ignored-during-calibration"))
    try:
        values, problems = measure(runs, course_root, only=only, progress=progress)
    finally:
        if old is None:
            os.environ.pop("LAB_CALIBRATION", None)
        else:
            os.environ["LAB_CALIBRATION"] = old
    specs = calibrated_checks()
    rows, thresholds, reasons = [], {}, {}
    for check, vals in values.items():
        value, why = derive(check, specs[check], machine.device_class, vals)
        thresholds[check] = value
        if value == "n/a":
            reasons[check] = why
        rows.append({"check": check, "better": specs[check]["better"],
                     "class default": specs[check].get(machine.device_class),
                     "reference median": statistics.median(vals) if vals else None,
                     "reference worst": (min(vals) if specs[check]["better"] == "higher" else max(vals))
                     if vals else None,
                     "runs": len(vals), "calibrated": value, "why": why})
    lines = [f"# Thresholds of this grading machine, written by `python -m autograder calibrate` on "
             f"{dt.datetime.now().isoformat(timespec='seconds')}.",
             "# Grading uses them on this machine only (same device class and device name); the rule "
             "is in autograder/calibrate.py.",
             "[machine]", f"device_class = {json.dumps(machine.device_class)}",
             f"device_name = {json.dumps(machine.device_name)}", "",
             "[calibration]", f"runs = {runs}", f"profile = {json.dumps(profile_for(machine.device_class).name)}",
             f"margin = {MARGIN}", f"speedup_floor = {SPEEDUP_FLOOR}", "", "[thresholds]"]
    lines += [f"{json.dumps(c)} = {json.dumps(v)}" for c, v in thresholds.items()]
    lines += ["", "[na]"] + [f"{json.dumps(c)} = {json.dumps(r)}" for c, r in reasons.items()]
    lines += ["", "[measured]  # every usable run of the reference"]
    lines += [f"{json.dumps(c)} = [{', '.join(f'{v:.4g}' for v in vals)}]" for c, vals in values.items()]
    if problems:
        lines += ["", "# problems:"] + [f"#   {p}" for p in problems]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    tomllib.loads(path.read_text())  # what we wrote must read back
    for line in problems:
        print("warning:", line)
    return path, pd.DataFrame(rows).set_index("check")
