"""``grade``: autograde every collected submission, generate feedback, export the grades as CSV.

The student's kernel runs the notebook; the grader decides the grade. For each student in
``submitted/`` (see collect.py), in name order:

1. Look for edited read-only cells (test cells, the graded-checks cell, the setup cell) by
   comparing them with the gradebook's record of the release. nbgrader restores them before it
   runs anything; the change is reported here and in the summary.
2. Run the graded notebooks one at a time, **in lab order** (01 ... 07), with nbgrader's autograde,
   each kernel in the submission's sandbox (:mod:`.sandbox`: no network, no view of the course,
   the gradebook or other students, bounded processes, disk, output and wall clock).
3. After each notebook, re-run its graded checks in a fresh verdict process (:mod:`.verdicts`),
   on the code its checks carried forward and nothing else of the kernel, and record those
   verdicts in the gradebook. The verdict processes measure each rung of the ladder into the
   grader's results store, ``results/<student>/``, which 06's checks read: what 06 grades is what
   the grader measured for 01-05 of the same submission, minutes earlier.
4. Put back any gradebook entry the submission must not have changed (another student's grades,
   extra credit nobody gave, a score above its maximum), then generate the feedback HTML of
   every notebook nbgrader ran to the end (a notebook the sandbox stopped has none: the summary
   says why).

A notebook whose cell runs past ``Execute.timeout`` (sized per device class below) is
interrupted by nbgrader, costs that cell, and is marked "timed out"; a notebook nbgrader cannot
process at all is marked "failed to run". A submission whose grading raised is marked "failed
to grade". None of them stops the batch, and the CSVs are written after every student.

Outputs in the course root: ``grades.csv`` (nbgrader's export, one row per student),
``grades_by_check.csv`` (one row per student and graded cell), ``grading_summary.csv`` (one row
per student and notebook: status, score, seconds, edited cells, cells the kernel scored otherwise
than the grader, gradebook repairs), ``results/<student>/`` (the grader's measurements),
``sandbox/<student>/`` (what the kernel wrote) and ``reports/<student>.html`` (the report the
student's 06 exported).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
import pandas as pd

from nbgrader.preprocessors import Execute

from . import course, release, sandbox, verdicts


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
    verdict_s: float = 0.0  # seconds the grader's verdict process took
    kernel_disagreed: list[str] = field(default_factory=list)  # test cells the kernel scored otherwise
    repaired: list[str] = field(default_factory=list)  # gradebook entries put back after this notebook


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


class BoundedExecute(Execute):
    """nbgrader's Execute, keeping at most ``max_output_bytes`` of a notebook's outputs.

    nbgrader's LimitOutput caps lines after the run; a flood of long lines (or one line) would
    still fill the notebook, the feedback and the grader's memory. Outputs beyond the cap are
    dropped as they arrive, with one line saying so.
    """

    max_output_bytes = 8 * 2**20

    def output(self, outs, msg, display_id, cell_index):
        used = getattr(self, "_output_bytes", 0)
        size = len(json.dumps(msg.get("content", {}), default=str))
        self._output_bytes = used + size
        if self._output_bytes <= self.max_output_bytes:
            return super().output(outs, msg, display_id, cell_index)
        left = self.max_output_bytes - used
        if msg["msg_type"] == "stream" and left > 0:  # keep the beginning of the text that overflows
            msg["content"]["text"] = msg["content"]["text"][:left]
            super().output(outs, msg, display_id, cell_index)
        if not getattr(self, "_truncated", False):
            self._truncated = True
            outs.append(nbformat.v4.new_output("stream", name="stderr", text=(
                f"... output truncated by the grader: the notebook printed more than "
                f"{self.max_output_bytes // 2**20} MiB ...\n")))
        return None


@dataclass
class Batch:
    """What every submission of one grading batch shares: sandbox, verdict settings, budgets."""

    course_root: Path
    timeout_s: int  # per cell
    notebook_budget_s: float  # wall clock of one notebook's kernel
    box: str | None  # why there is no sandbox (None: there is one)
    lib: Path  # the read-only copy of labsupport the sandboxes import
    settings: dict[str, str]  # the verdict spec's profile, thresholds, calibration, data
    cells: dict[str, dict[str, list[str]]]  # {notebook: {test cell: [check ids]}}

    @classmethod
    def prepare(cls, course_root: Path, timeout_s: int) -> "Batch":
        import labsupport
        from labsupport import grading
        from labsupport import dataset
        from labsupport.paths import data_root

        course_root = Path(course_root).resolve()
        dataset.ensure(progress=False)  # read-only in the sandboxes: it must be there before they start
        work = course_root / "sandbox"
        shutil.rmtree(work, ignore_errors=True)
        lib = work / "lib"
        shutil.copytree(Path(labsupport.__file__).parent, lib / "labsupport",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        spec = work / "spec"
        spec.mkdir(parents=True)
        thresholds = spec / "thresholds.toml"
        shutil.copyfile(grading.thresholds_path(), thresholds)
        calibration = course.calibration_file(course_root)
        if calibration.is_file():
            shutil.copyfile(calibration, spec / "calibration.toml")
        for path in [work, *work.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        settings = {"profile": os.environ.get("LAB_PROFILE", ""), "thresholds": str(thresholds),
                    "calibration": str(spec / "calibration.toml") if calibration.is_file() else None,
                    "data": str(data_root().resolve())}
        return cls(course_root, timeout_s, NOTEBOOK_BUDGET_CELLS * timeout_s, sandbox.problem(), lib,
                   settings, verdicts.checks_by_cell(course_root))


# A notebook's kernel may run for this many cell time limits in all (the pre_run_cell hook that
# sleeps just under the cell limit in every cell ends there); its verdict process for as many.
NOTEBOOK_BUDGET_CELLS = 4


def _kernel_spec(folder: Path, box: sandbox.Sandbox, log: Path) -> None:
    """A kernel spec ``lab-sandbox`` in ``folder`` (put on JUPYTER_PATH) that starts IPython in ``box``.

    nbgrader writes the connection file (mode 600, root's) into the bound run folder; the sandbox
    copies it to its own /tmp for the kernel, which runs as nobody. The kernel process's own
    output (its banner, C++ libraries' logging) goes to ``log``, not the grader's terminal.
    """
    argv = box.command([sys.executable, "-m", "ipykernel_launcher", "-f", "/tmp/kernel.json"],
                       before="cp '{connection_file}' /tmp/kernel.json && chmod 0644 /tmp/kernel.json",
                       log=log)
    spec = folder / "kernels" / "lab-sandbox"
    spec.mkdir(parents=True, exist_ok=True)
    # Interrupts by message: a signal to the sandbox's outer process would end the sandbox, where
    # nbgrader's interrupt at a cell's time limit must reach IPython inside it (ipykernel then
    # signals its own process group).
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "lab sandbox",
                                                  "language": "python", "interrupt_mode": "message"}))


def grade_student(course_root: Path, student: str, *, timeout_s: int,
                  batch: Batch | None = None) -> list[NotebookGrade]:
    """Autograde one student's notebooks in lab order, record the grader's verdicts, generate feedback.

    For each notebook: nbgrader runs it (in the submission's sandbox where there is one), then
    the verdict process re-runs its checks outside the kernel, and the gradebook records the
    verdicts. The gradebook is checked afterwards (:func:`verdicts.restore`).
    """
    from nbgrader.api import Gradebook
    from nbgrader.converters import Autograde, GenerateFeedback

    course_root = Path(course_root).resolve()
    batch = batch or Batch.prepare(course_root, timeout_s)
    assignment = course.assignment_id(course_root)
    folder = course_root / "submitted" / student / assignment
    names = lab_order(p.stem for p in course.graded_masters(course_root))
    store = course_root / "results" / student  # the grader's measurements: what 06 and the reports read
    work = batch.course_root / "sandbox" / student  # the kernel's side
    for path in (store, work):
        shutil.rmtree(path, ignore_errors=True)
    kernel_results, run_dir, cwd, spec_dir, report_dir, compiled = (
        work / n for n in ("results", "run", "cwd", "verdict", "report", "inductor"))
    kernel_report = report_dir / "report.html"
    for path in (kernel_results, run_dir, spec_dir, store, report_dir, compiled):
        path.mkdir(parents=True)
    shutil.copytree(folder, cwd)  # the kernel's working folder: the submission as handed in
    autograded = course_root / "autograded" / student / assignment
    env = {"LAB_RESULTS": str(kernel_results), "LAB_REPORT": str(kernel_report),
           # the batch's copy, which the sandbox can read (the course root is not in it)
           "LAB_CALIBRATION": batch.settings["calibration"] or os.devnull,
           "JUPYTER_RUNTIME_DIR": str(run_dir), "JUPYTER_PATH": str(work / "jupyter"),
           # One Inductor cache per submission, shared by its kernels and verdict processes (never
           # between submissions): the verdict re-uses what the kernel compiled for the same code.
           "TORCHINDUCTOR_CACHE_DIR": str(compiled)}
    # "immediate": the kernel is killed once its last cell has replied, not asked to run its exit
    # hooks (about 2 s of tearing torch down, per notebook). What it wrote, it wrote in its cells.
    settings = dict(Execute__timeout=timeout_s, Execute__shutdown_kernel="immediate")
    box = None
    if batch.box is None:
        sandbox.own(kernel_results, run_dir, cwd, store, spec_dir, report_dir, compiled)
        readable = (batch.lib, Path(batch.settings["data"]), Path(batch.settings["thresholds"]).parent)
        box = sandbox.Sandbox(writable=(kernel_results, run_dir, report_dir, compiled), readable=readable,
                              env={"PYTHONPATH": str(batch.lib), "TORCHINDUCTOR_CACHE_DIR": str(compiled)},
                              budget_s=batch.notebook_budget_s,
                              mounts=((cwd, autograded),))
        _kernel_spec(work / "jupyter", box, run_dir / "kernel.log")
        settings.update(Execute__kernel_name="lab-sandbox", KernelManager__transport="ipc",
                        KernelManager__ip=str(run_dir / "kernel"),
                        KernelManager__connection_file=str(run_dir / "connection.json"))
    verdict_box = None if box is None else sandbox.Sandbox(
        writable=(store, spec_dir, compiled), readable=(batch.lib, Path(batch.settings["data"]),
                                                        Path(batch.settings["thresholds"]).parent, kernel_report),
        budget_s=batch.notebook_budget_s)
    grades = []
    with course.venv_on_path(), Gradebook(_db_url(course_root)) as gb:
        before = verdicts.snapshot(gb, assignment)
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
                       CourseDirectory__notebook_id=name, Autograde__create_student=True, **settings)
            app.autograde_preprocessors = [BoundedExecute if pp is Execute else pp
                                           for pp in app.autograde_preprocessors]
            started, since = time.perf_counter(), time.time()
            written = (kernel_results, cwd, report_dir, compiled)  # where the kernel writes to disk
            with sandbox.watchdog(written, enabled=box is not None) as dog:
                outcome = _run(app)
            if box is not None:
                sandbox.kill_all()  # nothing the notebook started outlives it
            seconds = time.perf_counter() - started
            errors, timed_out = _cell_errors(autograded / f"{name}.ipynb")
            if not outcome["success"]:
                status = "failed to run"
                errors.append(_last_error_line(outcome))
            else:
                status = "timed out" if timed_out else "graded"
            if dog.tripped or sandbox.folder_bytes(*written) > sandbox.STORE_BYTES:
                errors.append(f"the notebook wrote more than {sandbox.STORE_BYTES / 2**20:.0f} MiB to disk: "
                              "it was stopped, and what it wrote was deleted")
                for extra in written:
                    shutil.rmtree(extra, ignore_errors=True)
                    extra.mkdir()
                    if box is not None:
                        sandbox.own(extra)
            number = name[:2]
            found = verdicts.run(number, kernel_results=kernel_results, store=store, spec_dir=spec_dir,
                                 report=kernel_report, since=since, settings=batch.settings, box=verdict_box,
                                 pythonpath=batch.lib, timeout_s=batch.notebook_budget_s,
                                 env={"TORCHINDUCTOR_CACHE_DIR": str(compiled)})
            if "error" in found:
                errors.append(f"verdicts: {found['error']}")
            passed = verdicts.cell_scores(found, batch.cells.get(name, {}))
            with course.venv_on_path(), Gradebook(_db_url(course_root)) as gb:
                disagreed = verdicts.record(gb, assignment, student, name, passed)
            grades.append(NotebookGrade(student, name, status, 0.0, 0.0, seconds, edited, errors,
                                        verdict_s=float(found.get("seconds", 0.0)), kernel_disagreed=disagreed))
        with course.venv_on_path(), Gradebook(_db_url(course_root)) as gb:
            repaired = verdicts.restore(gb, assignment, student, before)
        feedback = _run(_app(GenerateFeedback, course_root, CourseDirectory__student_id=student))
        if not feedback["success"]:
            print(f"{student}: generate_feedback failed: {_last_error_line(feedback)}")
    if kernel_report.is_file() and not kernel_report.is_symlink():
        (course_root / "reports").mkdir(exist_ok=True)
        shutil.copyfile(kernel_report, course_root / "reports" / f"{student}.html")
    scores = _notebook_scores(course_root, student)
    for g in grades:
        g.score, g.max_score, g.needs_manual = scores.get(g.notebook, (0.0, g.max_score, False))
        g.repaired = [r for r in repaired if g.notebook in r]
    if grades:  # a repair that names none of this student's notebooks goes on the first row
        grades[0].repaired += [r for r in repaired if not any(g.notebook in r for g in grades)]
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
    for column in ("edited_cells", "errors", "kernel_disagreed", "repaired"):
        if column in summary:
            summary[column] = summary[column].map(" | ".join)
    summary.to_csv(paths["grading_summary"], index=False)
    return paths


def grade(course_root: Path = course.COURSE_ROOT, students: list[str] | None = None, *,
          timeout_s: int | None = None, budget_s: float | None = None, sandboxed: bool = True,
          progress: bool = True) -> list[NotebookGrade]:
    """Autograde, generate feedback and export grades for ``students`` (default: all collected).

    The gradebook must know the release: run ``python -m autograder release`` first (grade does
    it when the gradebook is missing). ``timeout_s`` is the per-cell limit (default: the device
    class's), ``budget_s`` a notebook's wall clock (default: NOTEBOOK_BUDGET_CELLS cell limits);
    ``sandboxed=False`` grades without the sandbox (debugging the grader only).
    Returns one NotebookGrade per student and notebook.
    """
    from tqdm.auto import tqdm

    from labsupport.hardware import describe_machine

    course_root = Path(course_root).resolve()
    students = students_to_grade(course_root, students)
    machine = describe_machine()
    timeout_s = timeout_s or cell_timeout_s(machine.device_class)
    batch = Batch.prepare(course_root, timeout_s)
    if budget_s:
        batch.notebook_budget_s = budget_s
    if not sandboxed:
        batch.box = "--no-sandbox was given"
    print(f"grading {len(students)} submission(s) on {machine.device_name} ({machine.device_class}), "
          f"{timeout_s} s per cell at most, {batch.notebook_budget_s:.0f} s per notebook, "
          + ("each in its own sandbox (bubblewrap)" if batch.box is None else
             f"WITHOUT a sandbox: {batch.box}. Students' code then runs with the grader's rights: "
             "grade as root with bubblewrap installed (apt-get install bubblewrap)"))
    grades = []
    bar = tqdm(students, desc="grading", unit="student", disable=not progress)
    try:
        for student in bar:
            bar.set_postfix_str(student)
            try:
                grades += grade_student(course_root, student, timeout_s=timeout_s, batch=batch)
            except Exception as err:  # one submission's failure never stops the batch
                where = traceback.extract_tb(err.__traceback__)[-1]
                grades.append(NotebookGrade(student, "", "failed to grade", 0.0, 0.0, errors=[
                    f"{type(err).__name__}: {str(err)[:300]} ({Path(where.filename).name}:{where.lineno})"]))
            _export_quietly(course_root, grades)  # each student's grades are written as they are made
    finally:
        _export_quietly(course_root, grades)
    return grades


def students_to_grade(course_root: Path, students: list[str] | None = None) -> list[str]:
    """``students`` (default: every collected one), each checked to have a submission; makes sure
    the gradebook holds the release, which autograde checks notebooks against."""
    course_root = Path(course_root).resolve()
    students = students if students is not None else submitted_students(course_root)
    if not students:
        raise course.CourseError(f"No submissions in {course_root / 'submitted'}: run "
                                 "`python -m autograder collect <folder>` first.")
    unknown = [s for s in students if not (course_root / "submitted" / s).is_dir()]
    if unknown:
        raise course.CourseError(f"No submission for {', '.join(unknown)} in {course_root / 'submitted'}.")
    if not (course_root / "gradebook.db").exists():
        release.generate(course_root)
    return students


def _export_quietly(course_root: Path, grades: list[NotebookGrade]) -> None:
    """export(), reporting instead of raising: the CSVs must appear whatever one submission did."""
    try:
        export(course_root, grades)
    except Exception as err:  # e.g. a gradebook locked by a process that outlived its notebook
        print(f"could not export the grades yet ({type(err).__name__}: {err}); retrying after the next student")


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
                     "kernel disagreed": "; ".join(f"{n}: {', '.join(c)}" for n, c in
                                                   zip(group.notebook, group.kernel_disagreed) if c),
                     "gradebook repaired": "; ".join(r for rs in group.repaired for r in rs),
                     "failed to grade": named("failed to grade"),
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
