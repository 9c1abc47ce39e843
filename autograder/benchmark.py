"""``benchmark``: the reference's speed and memory checks, measured N times on this machine; and
with ``--grading``, the time ``grade`` takes on the reference submission, notebook by notebook.

Speed targets belong here, not in tests: a test asserts what grading promises (the reference
passes after ``calibrate`` on this machine, cheats fail, correctness partners hold), while this
prints what the reference achieves against each class-default bar, with its spread and margin,
for the README and the notes to quote. It runs the same graded checks ``calibrate`` runs, with
the reference's code carried forward the same way, and changes nothing on disk but its table.
"""

from __future__ import annotations

import datetime as dt
import statistics
from pathlib import Path

import pandas as pd

from . import calibrate, course
from .course import COURSE_ROOT, REPO_ROOT


def table(values: dict[str, list[float]], machine) -> pd.DataFrame:
    """One row per check: median, spread (min-max, IQR), the class default bar and the margin.

    The margin is how far the median clears the bar, as a ratio (above 1: clears it; for a
    "lower is better" check, bar / median). A check that is n/a on the class has no bar. The bar
    is :func:`labsupport.grading.bar`'s at the class's own profile, without a calibration.
    """
    from labsupport import grading

    specs = calibrate.calibrated_checks()
    defaults = grading.Bars(specs)
    rows = []
    for check, vals in values.items():
        spec = specs[check]
        found = grading.bar(check, machine.as_dict() if hasattr(machine, "as_dict") else vars(machine), None, defaults)
        bar = found.threshold if found.applies else "n/a"
        median = statistics.median(vals) if vals else None
        quartiles = statistics.quantiles(vals, n=4) if len(vals) >= 2 else [median, median, median]
        margin = None
        if median is not None and isinstance(bar, (int, float)) and median > 0:
            margin = median / bar if spec.better == "higher" else bar / median
        rows.append({"check": check, "better": spec.better, "runs": len(vals), "median": median,
                     "q1": quartiles[0], "q3": quartiles[-1], "min": min(vals) if vals else None,
                     "max": max(vals) if vals else None, "class default": bar, "margin": margin})
    return pd.DataFrame(rows).set_index("check")


def benchmark(runs: int = 5, where: course.Course | Path = COURSE_ROOT,
              out: Path | None = None) -> tuple[Path, pd.DataFrame]:
    """Measure the reference's calibrated checks ``runs`` times; write and return the table.

    The table goes to ``build/benchmark-<device class>.txt`` (or ``out``), headed by the machine.
    """
    from labsupport.hardware import describe_machine, profile_for

    machine = describe_machine()
    values, problems = calibrate.measure(runs, where)
    frame = table(values, machine)
    out = Path(out) if out else REPO_ROOT / "build" / f"benchmark-{machine.device_class}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    head = (f"Reference checks, {runs} runs, {dt.datetime.now().isoformat(timespec='minutes')}: "
            f"{machine.cpu_model if machine.device == 'cpu' else machine.device_name}, class "
            f"{machine.device_class}, profile {profile_for(machine.profile).name}, "
            f"{machine.cpu_cores} cores, torch {machine.torch_version}\n\n")
    body = frame.to_string(float_format=lambda v: f"{v:.3g}")
    notes = "".join(f"\n- {p}" for p in problems)
    out.write_text(head + body + ("\n\nProblems:" + notes if notes else "") + "\n")
    return out, frame



def checks_path(out: Path) -> Path:
    """Where :func:`grading_time` writes each check's measurement, bar and result (``grades_by_check.csv``'s rows)."""
    return Path(out).with_suffix(".checks.csv")


def grading_time(notebooks: tuple[str, ...] | None = None, where: course.Course | Path = COURSE_ROOT,
                 out: Path | None = None) -> tuple[Path, pd.DataFrame]:
    """Grade the reference submission (all graded notebooks, or ``notebooks`` such as ``("02",)``)
    in a temporary copy of the course, as ``grade`` grades a student, and time it.

    One row per notebook: its kernel (nbgrader's autograde in the sandbox), its verdict process,
    the rest of its grading (edited-cell comparison, sandbox set-up, gradebook), and a last row
    for what follows the notebooks (feedback, copying out, export). Written to
    ``build/grading-time-<device class>.txt`` (or ``out``), and each check's measurement, bar and
    result beside it (:func:`checks_path`).
    """
    import shutil
    import tempfile
    import time

    import nbformat

    from labsupport.hardware import describe_machine, profile_for

    from . import grade, gradebook, reference, release

    the = course.of(where)
    machine = describe_machine()
    with tempfile.TemporaryDirectory(prefix="lab-grading-time-") as tmp:
        root = Path(tmp) / "course"
        root.mkdir()
        shutil.copyfile(the.root / course.CONFIG_NAME, root / course.CONFIG_NAME)
        shutil.copytree(the.source, root / "source",
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        scratch = course.of(root)
        mine, theirs = the.calibration, scratch.calibration
        if mine.is_file() and mine != theirs:  # (LAB_CALIBRATION names one file for both)
            shutil.copyfile(mine, theirs)
        released = release.generate(scratch)
        read = lambda folder: {p.stem: nbformat.read(p, as_version=4) for p in sorted(folder.glob("*.ipynb"))}
        handed_in = reference.submission(read(released), read(root / "source" / released.name))
        folder = scratch.submitted("reference")
        folder.mkdir(parents=True)
        graded = {p.stem for p in course.graded_masters(scratch.root)}
        for name, nb in handed_in.items():
            if name in graded and (notebooks is None or name[:2] in notebooks):
                nbformat.write(nb, folder / f"{name}.ipynb")
        started = time.perf_counter()
        grades = grade.grade(scratch, ["reference"], progress=False)
        total = time.perf_counter() - started
        longest = {p.stem: longest_cell(p) for p in scratch.autograded("reference").glob("*.ipynb")}
        out = Path(out) if out else REPO_ROOT / "build" / f"grading-time-{machine.device_class}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        gradebook.scores_by_check(scratch).to_csv(checks_path(out), index=False)
    rows = [{"notebook": g.notebook, "score": f"{g.score:g}/{g.auto_max_score:g}" + (
                 f" (+{g.max_score - g.auto_max_score:g} by a person)" if g.max_score > g.auto_max_score else ""),
             "points": g.score, "automatic": g.auto_max_score, "kernel s": g.seconds,
             "verdict s": g.verdict_s, "other s": g.wall_s - g.seconds - g.verdict_s, "total s": g.wall_s,
             # the submission's sandboxes' peak while the notebook ran and was judged (memory cgroup)
             "peak memory GiB": None if g.peak_bytes is None else g.peak_bytes / 2**30,
             "longest cell s": longest.get(g.notebook, (None, ""))[0],
             "longest cell": longest.get(g.notebook, (None, ""))[1]}
            for g in grades if g.status != "missing"]
    inside = sum(r["total s"] for r in rows)
    rows.append({"notebook": "after the notebooks", "score": "", "points": None, "automatic": None, "kernel s": 0.0, "verdict s": 0.0,
                 "other s": total - inside, "total s": total - inside, "peak memory GiB": None, "longest cell s": None, "longest cell": ""})
    frame = pd.DataFrame(rows).set_index("notebook")
    head = (f"Grading the reference submission ({', '.join(notebooks) if notebooks else 'every graded notebook'}), "
            f"{dt.datetime.now().isoformat(timespec='minutes')}: "
            f"{machine.cpu_model if machine.device == 'cpu' else machine.device_name}, class {machine.device_class}, "
            f"profile {profile_for(machine.profile).name}, {machine.cpu_cores} cores: {total:.0f} s in all "
            f"({total / 60:.1f} min)\n\n")
    out.write_text(head + frame.to_string(float_format=lambda v: f"{v:.1f}") + "\n")
    return out, frame


def longest_cell(path: Path) -> tuple[float | None, str]:
    """The longest code cell of executed notebook ``path`` by the times nbclient records in each cell's
    metadata: ``(seconds, its grade id or index)``, or ``(None, "")`` where none were recorded."""
    import nbformat

    best: tuple[float | None, str] = (None, "")
    for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
        times = cell.get("metadata", {}).get("execution", {})
        begin, end = times.get("iopub.execute_input"), times.get("shell.execute_reply")
        if cell.cell_type != "code" or not (begin and end):
            continue
        took = (dt.datetime.fromisoformat(end.replace("Z", "+00:00"))
                - dt.datetime.fromisoformat(begin.replace("Z", "+00:00"))).total_seconds()
        if best[0] is None or took > best[0]:
            best = (took, cell.metadata.get("nbgrader", {}).get("grade_id") or f"cell {index}")
    return best
