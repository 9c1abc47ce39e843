"""``grade``: autograde every collected submission, generate feedback, export the grades as CSV.

For each student in ``submitted/`` (see collect.py), in name order:

1. Look for edited read-only cells (test cells, the graded-checks cell, the setup cell) by
   comparing them with the gradebook's record of the release. nbgrader restores them before it
   runs anything, so the original tests run; the change is reported here and in the summary.
2. Autograde the six notebooks one at a time, **in lab order** (01 ... 06), in the student's one
   autograded folder, with one results store per student that nothing else writes to: 06 then
   reads exactly what 01-05 measured on this grading machine, minutes earlier. (nbgrader would
   also sort the notebooks by name; we run them one by one so that the order is stated here, and
   so that each notebook gets its own status and time.)
3. Generate the feedback HTML of every notebook, including the ones that failed.

A notebook whose cell runs past ``Execute.timeout`` (sized per device class below) is
interrupted by nbgrader, costs that cell, and is marked "timed out"; a notebook nbgrader cannot
process at all is marked "failed to run" and scores 0. Neither stops the batch.

Outputs in the course root: ``grades.csv`` (nbgrader's export, one row per student),
``grades_by_check.csv`` (one row per student and graded cell), ``grading_summary.csv`` (one row
per student and notebook: status, score, seconds, edited cells), ``results/<student>/`` (the
results store the student's notebooks wrote at grading time) and ``reports/<student>.html``.
"""

from __future__ import annotations

import shutil
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
import pandas as pd

from . import course, release


# nbgrader's gradebook warns on every submission with SQLAlchemy 2 (nbgrader/api.py); harmless,
# not ours, and it would bury the progress bar.
warnings.filterwarnings("ignore", message="Object of type <Submitted", module="nbgrader")

# Cell outputs that mean nbgrader interrupted a cell at its time limit.
_TIMEOUT_ENAMES = {"CellTimeoutError", "KeyboardInterrupt"}


@dataclass
class NotebookGrade:
    """How one notebook of one submission was graded (one row of grading_summary.csv)."""

    student: str
    notebook: str
    status: str  # "graded", "timed out", "failed to run" or "missing"
    score: float
    max_score: float
    seconds: float = 0.0
    edited_cells: list[str] = field(default_factory=list)  # read-only cells the student changed
    errors: list[str] = field(default_factory=list)  # cells that raised: "cell id: Error: message"
    needs_manual: bool = False  # a manually graded cell (06's analysis) awaits the instructor


def cell_timeout_s(device_class: str) -> int:
    """The per-cell time limit for grading on ``device_class`` (the device-class table in
    labsupport.hardware; nbgrader's Execute.timeout, the option its Execute preprocessor honours)."""
    from labsupport.hardware import CLASSES

    if device_class in CLASSES:
        return CLASSES[device_class].cell_timeout_s
    return max(c.cell_timeout_s for c in CLASSES.values())


def lab_order(names) -> list[str]:
    """Notebook names in the lab's order: by their number prefix (01_profile before 02_...).

    Raises CourseError for a name without the two-digit prefix, since its place would be a guess.
    """
    names = list(names)
    unnumbered = [n for n in names if not (len(n) > 2 and n[:2].isdigit() and n[2] == "_")]
    if unnumbered:
        raise course.CourseError(f"notebooks {unnumbered} have no 'NN_' number prefix: the lab runs "
                                 "its notebooks in numbered order, so name every master 'NN_<topic>'.")
    return sorted(names, key=lambda n: (int(n[:2]), n))


def submitted_students(course_root: Path) -> list[str]:
    """The students with a folder in ``submitted/`` (collect.py puts them there)."""
    folder = Path(course_root) / "submitted"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


# --- edited read-only cells -------------------------------------------------------------------

def edited_cells(notebook: Path, notebook_id: str, course_root: Path) -> list[str]:
    """The read-only cells of a submitted notebook that differ from the release, by grade id.

    Uses nbgrader's own checksums from the gradebook (what autograde compares before restoring
    the cells). A read-only cell that was deleted counts as edited.
    """
    from nbgrader import utils
    from nbgrader.api import Gradebook

    nb = nbformat.read(notebook, as_version=4)
    submitted = {cell.metadata["nbgrader"]["grade_id"]: cell for cell in nb.cells
                 if cell.metadata.get("nbgrader", {}).get("grade_id")}
    edited = []
    with course.venv_on_path(), Gradebook(_db_url(course_root)) as gb:
        source = gb.find_notebook(notebook_id, course.assignment_id(course_root))
        for original in source.source_cells:
            if not original.locked:
                continue
            cell = submitted.get(original.name)
            if cell is None:
                edited.append(f"{original.name} (deleted)")
            elif utils.compute_checksum(cell) != original.checksum:
                edited.append(original.name)
    return edited


def _db_url(course_root: Path) -> str:
    return f"sqlite:///{(Path(course_root) / 'gradebook.db').resolve()}"


# --- autograde, feedback, export --------------------------------------------------------------

def _app(kind, course_root: Path, **settings):
    """An nbgrader converter app of ``kind`` on ``course_root`` with CourseDirectory ``settings``."""
    from nbgrader.coursedir import CourseDirectory

    cfg = course.load_config(course_root)
    for key, value in settings.items():
        section, name = key.split("__")
        cfg[section][name] = value
    app = kind(coursedir=CourseDirectory(config=cfg), config=cfg)
    app.force = True
    return app


def _run(app) -> dict:
    from nbgrader.utils import capture_log

    with course.venv_on_path():
        return capture_log(app)


def _cell_errors(autograded: Path) -> tuple[list[str], bool]:
    """Error outputs of an autograded notebook, and whether a cell hit the time limit."""
    if not autograded.exists():
        return [], False
    nb = nbformat.read(autograded, as_version=4)
    errors, timed_out = [], False
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                name = cell.metadata.get("nbgrader", {}).get("grade_id") or cell.get("id")
                errors.append(f"{name}: {out.get('ename')}: {str(out.get('evalue'))[:200]}")
                timed_out |= out.get("ename") in _TIMEOUT_ENAMES
    return errors, timed_out


def _notebook_scores(course_root: Path, student: str) -> dict[str, tuple[float, float, bool]]:
    """``{notebook: (score, max score, needs manual grading)}`` from the gradebook."""
    from nbgrader.api import Gradebook, MissingEntry

    out = {}
    with course.venv_on_path(), Gradebook(_db_url(course_root)) as gb:
        try:
            submission = gb.find_submission(course.assignment_id(course_root), student)
        except MissingEntry:
            return out
        for nb in submission.notebooks:
            out[nb.name] = (float(nb.score), float(nb.max_score), bool(nb.needs_manual_grade))
    return out


def grade_student(course_root: Path, student: str, *, timeout_s: int) -> list[NotebookGrade]:
    """Autograde one student's notebooks in lab order, then generate their feedback."""
    from nbgrader.converters import Autograde, GenerateFeedback

    course_root = Path(course_root).resolve()
    assignment = course.assignment_id(course_root)
    folder = course_root / "submitted" / student / assignment
    names = lab_order(p.stem for p in course.masters(course_root))
    results = course_root / "results" / student
    shutil.rmtree(results, ignore_errors=True)  # this grading's measurements only
    env = {"LAB_RESULTS": str(results), "LAB_REPORT": str(course_root / "reports" / f"{student}.html"),
           "LAB_CALIBRATION": str(course.calibration_file(course_root))}
    grades = []
    with course.environment(env):
        for name in names:
            path = folder / f"{name}.ipynb"
            if not path.exists():
                grades.append(NotebookGrade(student, name, "missing", 0.0, 0.0))
                continue
            try:
                edited = edited_cells(path, name, course_root)
            except Exception as err:  # an unreadable notebook: autograde reports it below
                edited = [f"(could not compare: {type(err).__name__}: {err})"]
            app = _app(Autograde, course_root, CourseDirectory__student_id=student,
                       CourseDirectory__notebook_id=name, Execute__timeout=timeout_s,
                       Autograde__create_student=True)
            started = time.perf_counter()
            outcome = _run(app)
            seconds = time.perf_counter() - started
            errors, timed_out = _cell_errors(course_root / "autograded" / student / assignment / f"{name}.ipynb")
            if not outcome["success"]:
                status = "failed to run"
                errors.append(_last_error_line(outcome))
            else:
                status = "timed out" if timed_out else "graded"
            grades.append(NotebookGrade(student, name, status, 0.0, 0.0, seconds, edited, errors))
        feedback = _run(_app(GenerateFeedback, course_root, CourseDirectory__student_id=student))
        if not feedback["success"]:
            print(f"{student}: generate_feedback failed: {_last_error_line(feedback)}")
    scores = _notebook_scores(course_root, student)
    for g in grades:
        g.score, g.max_score, g.needs_manual = scores.get(g.notebook, (0.0, g.max_score, False))
    return grades


def _last_error_line(outcome: dict) -> str:
    """The last [ERROR] line nbgrader logged (else the last line of its traceback)."""
    text = (outcome.get("log") or "") + "\n" + (outcome.get("error") or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("[ERROR]")]
    return (errors or lines or ["unknown error"])[-1][:300]


def scores_by_check(course_root: Path) -> pd.DataFrame:
    """One row per student and autograded cell: student, notebook, cell, score, max score."""
    from nbgrader.api import Gradebook

    rows = []
    with course.venv_on_path(), Gradebook(_db_url(course_root)) as gb:
        assignment = gb.find_assignment(course.assignment_id(course_root))
        for submission in assignment.submissions:
            for nb in submission.notebooks:
                for grade in nb.grades:
                    rows.append({"student": submission.student.id, "notebook": nb.name,
                                 "cell": grade.name, "score": grade.score, "max_score": grade.max_score,
                                 "needs_manual_grade": grade.needs_manual_grade})
    return pd.DataFrame(rows, columns=["student", "notebook", "cell", "score", "max_score",
                                       "needs_manual_grade"])


def export(course_root: Path, grades: list[NotebookGrade]) -> dict[str, Path]:
    """Write grades.csv (nbgrader's CSV export), grades_by_check.csv and grading_summary.csv."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    course_root = Path(course_root)
    paths = {name: course_root / f"{name}.csv" for name in ("grades", "grades_by_check", "grading_summary")}
    with course.venv_on_path(), Gradebook(_db_url(course_root)) as gb:
        CsvExportPlugin(to=str(paths["grades"]), config=course.load_config(course_root)).export(gb)
    scores_by_check(course_root).to_csv(paths["grades_by_check"], index=False)
    summary = pd.DataFrame([asdict(g) for g in grades])
    for column in ("edited_cells", "errors"):
        if column in summary:
            summary[column] = summary[column].map(" | ".join)
    summary.to_csv(paths["grading_summary"], index=False)
    return paths


def grade(course_root: Path = course.COURSE_ROOT, students: list[str] | None = None, *,
          timeout_s: int | None = None, progress: bool = True) -> list[NotebookGrade]:
    """Autograde, generate feedback and export grades for ``students`` (default: all collected).

    The gradebook must know the release: run ``python -m autograder release`` first (grade does
    it when the gradebook is missing). Returns one NotebookGrade per student and notebook.
    """
    from tqdm.auto import tqdm

    from labsupport.hardware import describe_machine

    course_root = Path(course_root).resolve()
    students = students if students is not None else submitted_students(course_root)
    if not students:
        raise course.CourseError(f"No submissions in {course_root / 'submitted'}: run "
                                 "`python -m autograder collect <folder>` first.")
    unknown = [s for s in students if not (course_root / "submitted" / s).is_dir()]
    if unknown:
        raise course.CourseError(f"No submission for {', '.join(unknown)} in {course_root / 'submitted'}.")
    if not (course_root / "gradebook.db").exists():
        release.generate(course_root)  # autograde needs the gradebook's record of the release
    machine = describe_machine()
    timeout_s = timeout_s or cell_timeout_s(machine.device_class)
    print(f"grading {len(students)} submission(s) on {machine.device_name} ({machine.device_class}), "
          f"{timeout_s} s per cell at most")
    grades = []
    bar = tqdm(students, desc="grading", unit="student", disable=not progress)
    for student in bar:
        bar.set_postfix_str(student)
        grades += grade_student(course_root, student, timeout_s=timeout_s)
    export(course_root, grades)
    return grades


def summary(grades: list[NotebookGrade]) -> pd.DataFrame:
    """One row per student: score, max, and which notebooks timed out, failed or were missing."""
    frame = pd.DataFrame([asdict(g) for g in grades])
    rows = []
    for student, group in frame.groupby("student", sort=True):
        def named(status):
            return ", ".join(group.loc[group.status == status, "notebook"]) or ""
        rows.append({"student": student, "score": group.score.sum(), "max": group.max_score.sum(),
                     "timed out": named("timed out"), "failed to run": named("failed to run"),
                     "missing": named("missing"),
                     "edited read-only cells": "; ".join(f"{n}: {', '.join(c)}" for n, c in
                                                         zip(group.notebook, group.edited_cells) if c),
                     "needs manual grading": ", ".join(group.loc[group.needs_manual, "notebook"])})
    return pd.DataFrame(rows).set_index("student")


def print_summary(grades: list[NotebookGrade], course_root: Path) -> None:
    """The end-of-grading summary: per student, then counts (graded, failed to run, timed out)."""
    table = summary(grades)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        print(table.to_string())
    statuses = pd.Series([g.status for g in grades])
    per_student = {s: {g.status for g in grades if g.student == s} for s in table.index}
    print(f"\n{len(per_student)} submission(s): "
          f"{sum(st <= {'graded'} for st in per_student.values())} graded in full, "
          f"{sum('failed to run' in st for st in per_student.values())} with a notebook that failed to run, "
          f"{sum('timed out' in st for st in per_student.values())} with a notebook that timed out, "
          f"{sum('missing' in st for st in per_student.values())} with a missing notebook "
          f"({int((statuses == 'graded').sum())} of {len(statuses)} notebooks graded normally).")
    root = course.shown(course_root)
    print(f"grades: {root}/grades.csv, per check: {root}/grades_by_check.csv, "
          f"summary: {root}/grading_summary.csv, feedback: {root}/feedback/<student>/")
