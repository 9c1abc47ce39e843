"""The grader's verdicts: each notebook's checks re-run outside the student's kernel, and recorded.

After nbgrader has run a notebook, :func:`run` starts the verdict process
(:mod:`labsupport.grading.verdict`) on the code that notebook's checks carried forward, in the
submission's sandbox where there is one. :func:`record` then writes what it measured into the
gradebook, test cell by test cell: a cell scores its points when every check it requires passed
(or does not apply here), else 0, whatever the kernel's own run of that cell said. A cell whose
kernel score differs is reported (the grade summary's "kernel disagreed" column).

:func:`snapshot` and :func:`restore` guard the gradebook around each submission: another
student's grades must come out as they went in, and this student's extra credit must be what
the instructor gave. Scores above a cell's maximum are cleared. Each repair is reported.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from . import course, sandbox

CHECK_ID = re.compile(r"""\[\s*["'](\d\d-[a-z0-9-]+)["']\s*\]""")
ENV_KEPT = ("PATH", "LANG", "LC_ALL", "ONEDNN_MAX_CPU_ISA", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS")  # what the verdict process inherits from the grader


def checks_by_cell(course_root: Path) -> dict[str, dict[str, list[str]]]:
    """``{notebook: {test cell id: [check ids it requires]}}``, read from the masters' test cells."""
    out = {}
    for master in course.masters(course_root):
        nb = nbformat.read(master, as_version=4)
        out[master.stem] = {cell.metadata["nbgrader"]["grade_id"]: CHECK_ID.findall(cell.source)
                            for cell in course.graded_test_cells(nb)}
    return out


def environment(extra: dict[str, str]) -> dict[str, str]:
    """The verdict process's environment: a few of the grader's variables, then ``extra``."""
    return {**{k: os.environ[k] for k in ENV_KEPT if k in os.environ}, **extra}


def run(number: str, *, kernel_results: Path, store: Path, spec_dir: Path, report: Path, since: float,
        settings: dict[str, str], box: sandbox.Sandbox | None, pythonpath: Path | None,
        timeout_s: float, env: dict[str, str] | None = None) -> dict:
    """Run notebook ``number``'s verdict process; returns its verdicts (``{"error": ...}`` if none).

    The code the kernel's checks carried forward (``code/<NN>.py``) and 01's trace are copied from
    the kernel's results store into the grader's ``store`` first: that is all it takes from the kernel.
    """
    for sub in ("code", "traces"):
        (store / sub).mkdir(parents=True, exist_ok=True)
    kept = kernel_results / "code" / f"{number}.py"
    if kept.is_file() and not kept.is_symlink():
        shutil.copyfile(kept, store / "code" / f"{number}.py")
    if number == "01":
        for trace in (kernel_results / "traces").glob("*.json"):
            if trace.is_file() and not trace.is_symlink():
                shutil.copy2(trace, store / "traces" / trace.name)
    out = spec_dir / f"verdict-{number}.json"
    out.unlink(missing_ok=True)
    spec = {"notebook": number, "store": str(store), "report": str(report), "since": since,
            "out": str(out), **settings}
    spec_path = spec_dir / f"spec-{number}.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    spec_path.chmod(0o644)
    argv = [sys.executable, "-m", "labsupport.grading.verdict", str(spec_path)]
    env = environment({**({"PYTHONPATH": str(pythonpath)} if pythonpath else {}), **(env or {})})
    if box is not None:
        sandbox.own(store, spec_dir)
        argv = box.command(argv)
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"the verdict process ran past {timeout_s:.0f} s"}
    finally:
        if box is not None:
            sandbox.kill_all()
    seconds = time.perf_counter() - started
    try:
        verdict = json.loads(out.read_text())
    except (OSError, ValueError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"the verdict process wrote no verdicts (exit {done.returncode}): {tail[0][:300]}",
                "seconds": seconds}
    verdict["seconds"] = seconds
    return verdict


def cell_scores(verdict: dict, cells: dict[str, list[str]]) -> dict[str, bool]:
    """``{test cell: passed}``: a cell passes when every check it requires passed or is n/a."""
    checks = verdict.get("checks", {})
    return {cell: bool(ids) and all(checks.get(i, {}).get("status") in ("pass", "n/a") for i in ids)
            for cell, ids in cells.items()}


def record(gb, assignment: str, student: str, notebook: str, passed: dict[str, bool]) -> list[str]:
    """Write the verdicts' scores for ``notebook``'s test cells; returns the cells the kernel scored otherwise."""
    from nbgrader.api import MissingEntry

    disagreed = []
    for cell, ok in passed.items():
        try:
            grade = gb.find_grade(cell, notebook, assignment, student)
        except MissingEntry:
            continue  # the notebook never ran far enough for nbgrader to record it: scores 0
        score = float(grade.max_score) if ok else 0.0
        if grade.auto_score is not None and float(grade.auto_score) != score:
            disagreed.append(f"{cell} (kernel {grade.auto_score:g}, grader {score:g})")
        grade.auto_score = score
    gb.db.commit()
    return disagreed


def snapshot(gb, assignment: str) -> dict[tuple[str, str, str], tuple]:
    """Every student's recorded grades: ``{(student, notebook, cell): (auto, manual, extra credit)}``."""
    from nbgrader.api import MissingEntry

    try:
        found = gb.find_assignment(assignment)
    except MissingEntry:
        return {}
    return {(sub.student.id, nb.name, g.name): (g.auto_score, g.manual_score, g.extra_credit)
            for sub in found.submissions for nb in sub.notebooks for g in nb.grades}


def restore(gb, assignment: str, student: str, before: dict) -> list[str]:
    """Undo what grading ``student`` must not have changed; returns what was repaired.

    Other students' grades go back to ``before``; this student's extra credit goes back to what
    it was before (an instructor's, or none); any score above its cell's maximum is cleared.
    """
    from nbgrader.api import MissingEntry

    repaired, seen = [], set()
    try:
        found = gb.find_assignment(assignment)
    except MissingEntry:
        return repaired
    for sub in found.submissions:
        for nb in sub.notebooks:
            for g in nb.grades:
                key = (sub.student.id, nb.name, g.name)
                now = (g.auto_score, g.manual_score, g.extra_credit)
                seen.add(key)
                if sub.student.id != student:
                    if key in before and now != before[key]:
                        g.auto_score, g.manual_score, g.extra_credit = before[key]
                        repaired.append(f"{key[0]}'s {key[1]} {key[2]} changed while grading {student}: restored")
                    continue
                given = before.get(key, (None, None, None))[2]
                if g.extra_credit != given:
                    repaired.append(f"{nb.name} {g.name}: extra credit {g.extra_credit} nobody gave: cleared")
                    g.extra_credit = given
                for column in ("auto_score", "manual_score"):
                    value = getattr(g, column)
                    if value is not None and (value > g.max_score or value < 0):
                        repaired.append(f"{nb.name} {g.name}: {column} {value} outside 0..{g.max_score:g}: cleared")
                        setattr(g, column, 0.0 if column == "auto_score" else None)
    gone = sorted({f"{k[0]}'s {k[1]}" for k in set(before) - seen if k[0] != student})
    repaired += [f"{g} disappeared from the gradebook while grading {student}: grade them again" for g in gone]
    gb.db.commit()
    return repaired
