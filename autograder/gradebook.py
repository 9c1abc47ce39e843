"""nbgrader's side of grading: its apps, the gradebook, and the CSVs exported from them.

Everything here reads or writes the course's gradebook (``gradebook.db``) or runs one of
nbgrader's converters (autograde, feedback) on the course; nothing runs a student's code (the
kernels nbgrader starts are :mod:`.submission`'s, in the sandbox). The grader's own decisions
live in ``verdicts/`` (:mod:`.deciding`) and are joined to the gradebook's scores here, in
``grades_by_check.csv``.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import nbformat
import pandas as pd

from . import boundary, course, deciding, reports
from .course import Course

# nbgrader's gradebook warns on every submission with SQLAlchemy 2 (nbgrader/api.py); harmless,
# not ours, and it would bury the progress bar.
warnings.filterwarnings("ignore", message="Object of type <Submitted", module="nbgrader")

JUDGED = ("check", "measured", "bar", "result", "reason", "note")  # the judge's table, per test cell


# --- nbgrader's apps ------------------------------------------------------------------------------

def app(kind, where: Course | Path, **settings):
    """An nbgrader converter app of ``kind`` on the course, with ``settings`` given as
    ``Section__name=value`` (e.g. ``CourseDirectory__student_id="alice"``)."""
    from nbgrader.coursedir import CourseDirectory

    cfg = course.of(where).app_config()
    for key, value in settings.items():
        section, name = key.split("__")
        cfg[section][name] = value
    made = kind(coursedir=CourseDirectory(config=cfg), config=cfg)
    made.force = True
    return made


LOGS = "grading_logs"  # in the course root: nbgrader's whole log of each app that failed, per student


def run(made) -> dict:
    """Run an nbgrader app, capturing its log: ``{"success": bool, "log": str, "error": str}``.

    When it fails, its whole log and traceback are kept in ``grading_logs/<student>/<notebook>.<app>.log``
    (:func:`log_path`; ``"log_path"`` in the answer, ``"log_name"`` relative to the course root, where
    a task's copy brings it back): the summary's one line (:func:`last_error_line`)
    names that file. A later run of the same app that succeeds removes it."""
    from nbgrader.utils import capture_log

    with course.venv_on_path():
        outcome = capture_log(made)
    path = log_path(made)
    if path is None:
        return outcome
    if outcome["success"]:
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the student's folder, once it holds no log
            path.parent.rmdir()
        return outcome
    with contextlib.suppress(OSError):  # a log that cannot be kept leaves the one line of the summary
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# nbgrader {type(made).__name__}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
                        f"grader pid {os.getpid()}\n\n--- log ---\n{outcome.get('log') or ''}\n"
                        f"--- traceback ---\n{outcome.get('error') or ''}\n{_kernel_output(made)}")
        outcome["log_path"] = str(path)
        outcome["log_name"] = str(path.relative_to(Path(made.coursedir.root)))
    return outcome


KERNEL_LOG_BYTES = 4 * 2**20  # of the kernel's own output, read back into a failed notebook's log


def _kernel_output(made) -> str:
    """The end of the sandboxed kernel's own output (bwrap's, the shell's, Python's before IPython
    runs a cell), where the app ran one (:func:`.kernel.output`): read from its run folder (the
    sandbox's) through :func:`.boundary.read`, which follows no link the kernel left."""
    from . import kernel

    log = kernel.output(made.config)
    if log is None:
        return ""
    try:
        text = boundary.read(log.parent, log.name, KERNEL_LOG_BYTES).decode(errors="replace")
    except (OSError, boundary.Refused) as err:
        text = f"(none: {type(err).__name__}: {err})"
    return f"--- the kernel's own output ({log}, its end) ---\n{text[-20000:]}\n"


def log_path(made) -> Path | None:
    """Where a failed run of the nbgrader app ``made`` keeps its log (None for an app of no one student)."""
    coursedir = getattr(made, "coursedir", None)
    student = getattr(coursedir, "student_id", "*")
    if coursedir is None or not student or "*" in student:
        return None
    notebook = coursedir.notebook_id if coursedir.notebook_id and "*" not in coursedir.notebook_id else "all"
    return Path(coursedir.root) / LOGS / student / f"{notebook}.{type(made).__name__.lower()}.log"


def last_error_line(outcome: dict) -> str:
    """The last [ERROR] line an nbgrader app logged (else the last line of its traceback), and the
    file that keeps its whole log (:func:`run`)."""
    line = _last_error(outcome)
    if outcome.get("log_name"):  # relative: a task's course copy is not the course root its files end in
        line += f" (whole log: {outcome['log_name']} in the course root)"
    return line


# nbgrader's last words after a failure point elsewhere ("Please see the above traceback"): not the error.
_POINTERS = ("see the above traceback", "see the the above traceback", "see the error log")
# A traceback's last line: the exception raised ("RuntimeError: the kernel exited ...").
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Refused|Stopped)\b")


def _last_error(outcome: dict) -> str:
    """The root of a failure in a line: the exception nbgrader logged (the traceback of what went
    wrong), after its last [ERROR] line that says more than a pointer; else the exception that
    ended the app."""
    def lines(text):
        return [line.strip() for line in (text or "").splitlines()
                if line.strip() and not any(p in line for p in _POINTERS)]

    logged, ended = lines(outcome.get("log")), lines(outcome.get("error"))
    errors = [line for line in logged if line.startswith("[ERROR]") and "Traceback (most recent call last)" not in line]
    raised = ([line for line in logged if _RAISED.match(line)] or [line for line in ended if _RAISED.match(line)])
    said = "; ".join(dict.fromkeys(errors[-1:] + raised[-1:]))
    return said[:300] or ((logged + ended) or ["unknown error"])[-1][:300]


def feedback(where: Course | Path, student: str) -> None:
    """nbgrader's feedback pages for ``student``, each opened by the grader's table of its checks."""
    from nbgrader.converters import GenerateFeedback

    the = course.of(where)
    made = run(app(GenerateFeedback, the, CourseDirectory__student_id=student))
    if not made["success"]:
        print(f"{student}: generate_feedback failed: {last_error_line(made)}")
    for kept in sorted(the.verdicts(student).glob("*.json")):
        reports.judged_feedback(the, student, kept.stem, deciding.kept(the, student, kept.stem),
                                deciding.noted(the, student, kept.stem))


# --- what the gradebook knows ---------------------------------------------------------------------

def edited_cells(notebook: Path, notebook_id: str, where: Course | Path) -> list[str]:
    """The read-only cells of a submitted notebook that differ from the release, by grade id.

    Uses nbgrader's own checksums from the gradebook (what autograde compares before restoring
    the cells). A read-only cell that was deleted counts as edited.
    """
    from nbgrader import utils

    the = course.of(where)
    nb = nbformat.read(notebook, as_version=4)
    submitted = {cell.metadata["nbgrader"]["grade_id"]: cell for cell in nb.cells
                 if cell.metadata.get("nbgrader", {}).get("grade_id")}
    edited = []
    with the.gradebook() as gb:
        source = gb.find_notebook(notebook_id, the.assignment)
        for original in source.source_cells:
            if not original.locked:
                continue
            cell = submitted.get(original.name)
            if cell is None:
                edited.append(f"{original.name} (deleted)")
            elif utils.compute_checksum(cell) != original.checksum:
                edited.append(original.name)
    return edited


def notebook_scores(where: Course | Path, student: str) -> dict[str, tuple[float, float, bool, float]]:
    """``{notebook: (score, max score, needs manual grading, automatic max score)}`` from the gradebook
    (the automatic points are the code test cells'; 06's written analysis is a person's)."""
    from nbgrader.api import MissingEntry

    the = course.of(where)
    out = {}
    with the.gradebook() as gb:
        try:
            submission = gb.find_submission(the.assignment, student)
        except MissingEntry:
            return out
        for nb in submission.notebooks:
            out[nb.name] = (float(nb.score), float(nb.max_score), bool(nb.needs_manual_grade),
                            float(nb.max_code_score))
    return out


def scores_by_check(where: Course | Path) -> pd.DataFrame:
    """One row per student and graded cell: its score and the grader's decision on the check(s) it
    requires (:data:`JUDGED`, from ``verdicts/<student>/<notebook>.json``; empty for a person's cell)."""
    the = course.of(where)
    rows = []
    cells = deciding.checks_by_cell(the)
    with the.gradebook() as gb:
        assignment = gb.find_assignment(the.assignment)
        for submission in assignment.submissions:
            for nb in submission.notebooks:
                decided = deciding.kept(the, submission.student.id, nb.name)
                for grade in nb.grades:
                    found = [decided.get(c, {"check": c, "result": "not graded"})
                             for c in cells.get(nb.name, {}).get(grade.name, [])]
                    rows.append({"student": submission.student.id, "notebook": nb.name,
                                 "cell": grade.name, "score": grade.score, "max_score": grade.max_score,
                                 "needs_manual_grade": grade.needs_manual_grade,
                                 **{k: " | ".join("" if d.get(k) is None else
                                                  f"{d[k]:.4g}" if isinstance(d[k], float) else str(d[k])
                                                  for d in found) for k in JUDGED}})
    return pd.DataFrame(rows, columns=["student", "notebook", "cell", "score", "max_score",
                                       "needs_manual_grade", *JUDGED])


# --- exported -------------------------------------------------------------------------------------

def export(where: Course | Path, grades: list) -> dict[str, Path]:
    """Write grades.csv (nbgrader's CSV export), grades_by_check.csv and grading_summary.csv
    (one row per :class:`~.submission.NotebookGrade` in ``grades``)."""
    from nbgrader.plugins import CsvExportPlugin

    the = course.of(where)
    paths = {name: the.root / f"{name}.csv" for name in ("grades", "grades_by_check", "grading_summary")}
    with the.gradebook() as gb:
        CsvExportPlugin(to=str(paths["grades"]), config=the.app_config()).export(gb)
    scores_by_check(the).to_csv(paths["grades_by_check"], index=False)
    summary = pd.DataFrame([asdict(g) for g in grades])
    for column in ("edited_cells", "errors", "repaired", "review"):
        if column in summary:
            summary[column] = summary[column].map(" | ".join)
    summary.to_csv(paths["grading_summary"], index=False)
    return paths


def export_quietly(where: Course | Path, grades: list) -> None:
    """:func:`export`, reporting instead of raising: the CSVs must appear whatever one submission did."""
    try:
        export(where, grades)
    except Exception as err:  # e.g. a gradebook locked by a process that outlived its notebook
        print(f"could not export the grades yet ({type(err).__name__}: {err}); retrying after the next student")


# --- one gradebook's submission into another ------------------------------------------------------

def copy_database(source: Path, dest: Path) -> None:
    """A consistent copy of a gradebook, even while another grader writes to it (sqlite's backup)."""
    with contextlib.closing(sqlite3.connect(f"{Path(source).as_uri()}?mode=ro", uri=True)) as theirs, \
            contextlib.closing(sqlite3.connect(dest)) as ours:
        theirs.backup(ours)


def merge_submission(where: Course | Path, task_db: Path, student: str) -> None:
    """Copy ``student``'s submission (every column of its grades, comments, notebooks) from another
    gradebook (a grading task's) into the course's, replacing what the course's held for them.
    Nothing of any other student's is read or written: a task's gradebook speaks only for its own
    student."""
    from nbgrader.api import Gradebook, MissingEntry

    the = course.of(where)
    with the.gradebook() as ours, Gradebook(f"sqlite:///{task_db}") as theirs:
        sub = theirs.find_submission(the.assignment, student)
        person = sub.student
        ours.update_or_create_student(student, **{c.key: getattr(person, c.key) for c in
                                                  type(person).__table__.columns if not c.primary_key})
        try:
            ours.remove_submission(the.assignment, student)
        except MissingEntry:
            pass
        target = ours.add_submission(the.assignment, student)
        _copy_columns(sub, target)
        for nb in sub.notebooks:
            _copy_columns(nb, ours.find_submission_notebook(nb.name, the.assignment, student))
            for g in nb.grades:
                _copy_columns(g, ours.find_grade(g.name, nb.name, the.assignment, student))
            for c in nb.comments:
                _copy_columns(c, ours.find_comment(c.name, nb.name, the.assignment, student))
        ours.db.commit()


def _copy_columns(source, target) -> None:
    """Every column of a gradebook row but its keys (scores, extra credit, needs-manual-grade,
    comments, flags, timestamp): the whole of what nbgrader stores, whatever its version adds."""
    for column in type(source).__table__.columns:
        if not column.primary_key and not column.foreign_keys:
            setattr(target, column.key, getattr(source, column.key))
