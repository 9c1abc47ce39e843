"""``grade``: autograde every collected submission, generate feedback, export the grades as CSV.

The student's kernel runs the notebook; the grader decides the grade. For each student in
``submitted/`` (see collect.py), in name order:

1. Look for edited read-only cells (test cells, the graded-checks cell, the setup cell) by
   comparing them with the gradebook's record of the release. nbgrader restores them before it
   runs anything; the change is reported here and in the summary.
2. Run the graded notebooks one at a time, **in lab order** (01 ... 07), with nbgrader's autograde,
   each kernel in the submission's sandbox (:mod:`.sandbox`: no network, no view of the course,
   the gradebook or other students, bounded processes, disk, output and wall clock).
3. After each notebook, re-run its graded checks in a fresh verdict process (:mod:`.deciding`),
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
and ``reports/<student>.html`` (the report the student's 06 exported), both copied out of the
submission's folders through :mod:`.boundary` (root follows no link a sandbox left). The
submission's own folders, ``sandbox/students/<student>/`` (a size-limited tmpfs where it can be
mounted), are removed once it is graded.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import nbformat
import pandas as pd

from nbgrader.preprocessors import Execute

from . import boundary, course, deciding, release, reports, sandbox


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
    review: list[str] = field(default_factory=list)  # checks held for a person, with their figures
    wall_s: float = 0.0  # this notebook's grading from start to recorded: kernel, verdict and the rest
    auto_max_score: float = 0.0  # the points the grader decides (max_score less the manual ones)


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


def _notebook_scores(course_root: Path, student: str) -> dict[str, tuple[float, float, bool, float]]:
    """``{notebook: (score, max score, needs manual grading, automatic max score)}`` from the gradebook
    (the automatic points are the code test cells'; 06's written analysis is a person's)."""
    from nbgrader.api import Gradebook, MissingEntry

    out = {}
    with course.venv_on_path(), Gradebook(_db_url(course_root)) as gb:
        try:
            submission = gb.find_submission(course.assignment_id(course_root), student)
        except MissingEntry:
            return out
        for nb in submission.notebooks:
            out[nb.name] = (float(nb.score), float(nb.max_score), bool(nb.needs_manual_grade),
                            float(nb.max_code_score))
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
    """What every submission of one grading batch shares: sandbox, verdict settings, budgets.

    On disk, in the course root's ``sandbox/``: ``batch/`` holds the batch's own read-only files
    (the copy of labsupport the sandboxes import, the thresholds and calibration), and
    ``students/<student>/`` each submission's folders, so no student id can name the batch's.
    """

    course_root: Path
    timeout_s: int  # per cell
    notebook_budget_s: float  # wall clock of one notebook's kernel, and of its verdict process
    submission_budget_s: float  # wall clock of all of one submission's kernels and verdicts
    box: str | None  # why there is no sandbox (None: there is one)
    lib: Path  # the read-only copy of labsupport the sandboxes import
    settings: dict[str, str]  # the verdict spec's profile, thresholds, calibration, data
    cells: dict[str, dict[str, list[str]]]  # {notebook: {test cell: [check ids]}}
    machine: object = None  # labsupport.hardware.Machine: the grader's own view of this machine
    memory: str | None = None  # why the sandboxes have no memory limit (None: they have one)
    disk: str | None = None  # why a submission's disk is counted by the watchdog, not a filesystem

    @classmethod
    def prepare(cls, course_root: Path, timeout_s: int) -> "Batch":
        import labsupport
        from labsupport import dataset, grading, hardware
        from labsupport.paths import data_root

        course_root = Path(course_root).resolve()
        dataset.ensure(progress=False)  # read-only in the sandboxes: it must be there before they start
        work = course_root / "sandbox"
        sandbox.unmount_below(work)  # what a grader that crashed left mounted
        shutil.rmtree(work, ignore_errors=True)
        lib = work / "batch" / "lib"
        shutil.copytree(Path(labsupport.__file__).parent, lib / "labsupport",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        spec = work / "batch" / "spec"
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
        box = sandbox.problem()
        memory = box or sandbox.memory_cgroup()[1]
        gpu = None if box else sandbox.gpu_problem(sandbox.Sandbox(writable=(), readable=(lib, Path(settings["data"])),
                                                                   env={"PYTHONPATH": str(lib)}))
        if gpu:
            raise course.CourseError(gpu)
        return cls(course_root, timeout_s, NOTEBOOK_BUDGET_CELLS * timeout_s, SUBMISSION_BUDGET_CELLS * timeout_s,
                   box, lib, settings, deciding.checks_by_cell(course_root),
                   machine=hardware.describe_machine(hardware.pick_device()), memory=memory)


# A notebook's kernel may run for this many cell time limits in all (the pre_run_cell hook that
# sleeps just under the cell limit in every cell ends there); its verdict process for as many.
NOTEBOOK_BUDGET_CELLS = 4
# All of one submission's kernels and verdict processes together: on class cpu (900 s cells) 90
# minutes, on a GPU 60, where the reference takes about a tenth of that.
SUBMISSION_BUDGET_CELLS = 6
# A submission's tmpfs: its disk quota (the watchdog stops it there) and room to be stopped in.
DISK_HEADROOM = 1.25


def _kernel_spec(folder: Path, box: sandbox.Sandbox, log: Path) -> None:
    """A kernel spec ``lab-sandbox`` in ``folder`` (put on JUPYTER_PATH) that starts IPython in ``box``.

    nbgrader writes the connection file (mode 600, root's) into the run folder, made fresh for
    each notebook; the sandbox copies it to its own /tmp for the kernel, which runs as nobody. The
    kernel process's own output (its banner, C++ libraries' logging) goes to ``log``, not the
    grader's terminal.
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


@dataclass
class Folders:
    """One submission's folders, all in ``work`` (root's: no sandboxed process can rename or
    replace anything in it, only write inside the folders below that it was given)."""

    work: Path

    def __getattr__(self, name):
        kinds = {"results": "the kernel's results store", "run": "the kernel's Jupyter runtime folder",
                 "cwd": "the kernel's working folder", "report": "the HTML the kernel's 06 exports",
                 "inductor": "torch.compile's cache (kernels and verdict processes)",
                 "store": "the grader's results store (verdict processes)", "outbox": "verdicts",
                 "inputs": "what root hands a verdict process (root's, read-only)",
                 "judged": "what the judge keeps for later notebooks: checks, rungs, code (root's)",
                 "jupyter": "the kernel spec (root's)"}
        if name not in kinds:
            raise AttributeError(name)
        return self.work / name

    def fresh(self, *names: str, owned: bool = True) -> None:
        """Make ``names`` empty again: removed (without following links) and made anew, given to
        the sandbox user where ``owned``. Safe at any time, since ``work`` is root's."""
        for name in names:
            path = getattr(self, name)
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
            if owned:
                sandbox.own(path)


def grade_student(course_root: Path, student: str, *, timeout_s: int,
                  batch: Batch | None = None) -> list[NotebookGrade]:
    """Autograde one student's notebooks in lab order, record the grader's verdicts, generate feedback.

    For each notebook: nbgrader runs it (in the submission's sandbox where there is one), then
    the verdict process re-runs its checks outside the kernel, and the gradebook records the
    verdicts. The gradebook is checked afterwards (:func:`deciding.restore`). The kernels and
    verdict processes of one submission share one wall clock (``batch.submission_budget_s``), one
    disk (a tmpfs of STORE_BYTES, or the watchdog) and one memory limit (the grader's cgroup).
    What the grader keeps (the results store, the exported report) is copied out through
    :mod:`.boundary` at the end, and the submission's folders are removed.
    """
    from nbgrader.api import Gradebook
    from nbgrader.converters import Autograde

    course_root = Path(course_root).resolve()
    batch = batch or Batch.prepare(course_root, timeout_s)
    course.check_student_id(student)
    assignment = course.assignment_id(course_root)
    folder = course_root / "submitted" / student / assignment
    names = lab_order(p.stem for p in course.graded_masters(course_root))
    kept = course_root / "results" / student  # the grader's measurements, copied out at the end
    dirs = Folders(batch.course_root / "sandbox" / "students" / student)
    sandbox.unmount_below(dirs.work)
    for path in (kept, dirs.work, course_root / "verdicts" / student):
        shutil.rmtree(path, ignore_errors=True)
    deadline = time.monotonic() + batch.submission_budget_s
    try:
        grades, before = _grade_in(course_root, student, batch, dirs, folder, names, deadline, Autograde)
        with course.venv_on_path(), Gradebook(_db_url(course_root)) as gb:
            repaired = deciding.restore(gb, assignment, student, before)
        feedback(course_root, student)
        try:
            (course_root / "reports").mkdir(exist_ok=True)
            boundary.copy_file(dirs.report, "report.html", course_root / "reports" / f"{student}.html")
        except OSError:
            pass  # no report exported (06 did not run, or wrote something else): the summary says so
        if dirs.store.is_dir():
            skipped = boundary.copy_tree(dirs.store, kept)
            if skipped and grades:
                grades[0].errors.append(f"results not kept: {'; '.join(skipped[:5])}")
        if dirs.judged.is_dir():  # the judge's own files (root's), over whatever the store held of them
            shutil.copytree(dirs.judged, kept, dirs_exist_ok=True)
    finally:
        sandbox.unmount_below(dirs.work)
        shutil.rmtree(dirs.work, ignore_errors=True)
    scores = _notebook_scores(course_root, student)
    for g in grades:
        g.score, g.max_score, g.needs_manual, g.auto_max_score = scores.get(g.notebook, (0.0, g.max_score, False, 0.0))
        g.repaired = [r for r in repaired if g.notebook in r]
    if grades:  # a repair that names none of this student's notebooks goes on the first row
        grades[0].repaired += [r for r in repaired if not any(g.notebook in r for g in grades)]
    return grades


def feedback(course_root: Path, student: str) -> None:
    """nbgrader's feedback pages for ``student``, each opened by the grader's table of its checks."""
    from nbgrader.converters import GenerateFeedback

    made = _run(_app(GenerateFeedback, course_root, CourseDirectory__student_id=student))
    if not made["success"]:
        print(f"{student}: generate_feedback failed: {_last_error_line(made)}")
    for kept in sorted((Path(course_root) / "verdicts" / student).glob("*.json")):
        reports.judged_feedback(course_root, student, kept.stem, deciding.kept(course_root, student, kept.stem))


def _grade_in(course_root: Path, student: str, batch: Batch, dirs: Folders, folder: Path,
              names: list[str], deadline: float, Autograde) -> tuple[list[NotebookGrade], dict]:
    """Run and judge each notebook of ``student`` in ``dirs``; returns the NotebookGrades and the
    gradebook's snapshot from before (for :func:`deciding.restore`)."""
    from nbgrader.api import Gradebook

    assignment = course.assignment_id(course_root)
    sandboxed = batch.box is None
    dirs.work.mkdir(parents=True)
    if sandboxed and batch.disk is None:
        why = sandbox.mount_disk(dirs.work, int(sandbox.STORE_BYTES * DISK_HEADROOM))
        if why:  # said once for the batch: the watchdog counts files instead
            batch.disk = f"no size-limited filesystem per submission ({why})"
            print(f"note: {batch.disk}; the watchdog counts each submission's files instead")
    disk = dirs.work if sandboxed and batch.disk is None else None
    dirs.fresh("results", "report", "inductor", "store", "outbox", owned=sandboxed)
    dirs.fresh("judged", owned=False)
    shutil.copytree(folder, dirs.cwd)  # the kernel's working folder: the submission as handed in
    if sandboxed:
        sandbox.own(dirs.cwd)
    kernel_report = dirs.report / "report.html"
    autograded = course_root / "autograded" / student / assignment
    env = {"LAB_RESULTS": str(dirs.results), "LAB_REPORT": str(kernel_report),
           # the batch's copy, which the sandbox can read (the course root is not in it)
           "LAB_CALIBRATION": batch.settings["calibration"] or os.devnull,
           "LAB_THRESHOLDS": batch.settings["thresholds"],  # the batch's copy, for the grader's decisions too
           "JUPYTER_RUNTIME_DIR": str(dirs.run), "JUPYTER_PATH": str(dirs.jupyter),
           # One Inductor cache per submission, shared by its kernels and verdict processes (never
           # between submissions): the verdict re-uses what the kernel compiled for the same code.
           "TORCHINDUCTOR_CACHE_DIR": str(dirs.inductor)}
    readable = (batch.lib, Path(batch.settings["data"]), Path(batch.settings["thresholds"]).parent)
    box = verdict_box = None
    if sandboxed:
        box = sandbox.Sandbox(writable=(dirs.results, dirs.run, dirs.report, dirs.inductor), readable=readable,
                              env={"PYTHONPATH": str(batch.lib), "TORCHINDUCTOR_CACHE_DIR": str(dirs.inductor)},
                              mounts=((dirs.cwd, autograded),))
        verdict_box = sandbox.Sandbox(writable=(dirs.store, dirs.outbox, dirs.inductor),
                                      readable=readable + (dirs.report, dirs.inputs))
    written = (dirs.results, dirs.cwd, dirs.report, dirs.inductor, dirs.run)  # where the kernel writes
    grades = []
    with course.venv_on_path(), Gradebook(_db_url(course_root)) as gb:
        before = deciding.snapshot(gb, assignment)
    with course.environment(env):
        for name in names:
            path = folder / f"{name}.ipynb"
            if not path.exists():
                grades.append(NotebookGrade(student, name, "missing", 0.0, 0.0))
                continue
            left = deadline - time.monotonic()
            if left < 1:
                grades.append(NotebookGrade(student, name, "out of time", 0.0, 0.0, errors=[
                    f"not run: the submission used its {batch.submission_budget_s:.0f} s of grading "
                    "(all notebooks and verdicts together)"]))
                continue
            began = time.perf_counter()
            try:
                edited = edited_cells(path, name, course_root)
            except Exception as err:  # an unreadable notebook: autograde reports it below
                edited = [f"(could not compare: {type(err).__name__}: {err})"]
            # "immediate": the kernel is killed once its last cell has replied, not asked to run its
            # exit hooks (about 2 s of tearing torch down, per notebook).
            settings = dict(Execute__timeout=max(1, int(min(batch.timeout_s, left))),
                            Execute__shutdown_kernel="immediate")
            dirs.fresh("run", owned=sandboxed)  # what the last kernel left there is gone
            if box is not None:
                _kernel_spec(dirs.jupyter, replace(box, budget_s=min(batch.notebook_budget_s, left)),
                             dirs.run / "kernel.log")
                settings.update(Execute__kernel_name="lab-sandbox", KernelManager__transport="ipc",
                                KernelManager__ip=str(dirs.run / "kernel"),
                                KernelManager__connection_file=str(dirs.run / "connection.json"))
            app = _app(Autograde, course_root, CourseDirectory__student_id=student,
                       CourseDirectory__notebook_id=name, Autograde__create_student=True, **settings)
            # the config's stand-in (nbgrader autograde alone refuses to grade) becomes the sandboxed run
            app.autograde_preprocessors = [BoundedExecute if pp is Execute or getattr(pp, "replaced_by_the_grader", False)
                                           else pp for pp in app.autograde_preprocessors]
            started, since = time.perf_counter(), time.time()
            kills = sandbox.memory_kills()
            with sandbox.watchdog(written, enabled=sandboxed, disk=disk) as dog:
                outcome = _run(app)
            if sandboxed:
                sandbox.kill_all()  # nothing the notebook started outlives it
            seconds = time.perf_counter() - started
            errors, timed_out = _cell_errors(autograded / f"{name}.ipynb")
            if not outcome["success"]:
                status = "failed to run"
                errors.append(_last_error_line(outcome))
            else:
                status = "timed out" if timed_out else "graded"
            if sandbox.memory_kills() > kills:
                errors.append(f"the notebook used more than {sandbox.memory_bytes() / 2**30:.1f} GiB of memory: "
                              "the sandbox's limit stopped it")
            if dog.tripped or (sandboxed and sandbox.disk_used(written, disk) > sandbox.STORE_BYTES):
                errors.append(f"the notebook wrote more than {sandbox.STORE_BYTES / 2**20:.0f} MiB to disk: "
                              "it was stopped, and what it wrote was deleted")
                dirs.fresh("results", "cwd", "report", "inductor", owned=sandboxed)
            left = deadline - time.monotonic()
            if left < 1:
                found = {"error": "no time was left for the verdict process: the submission used its "
                                  f"{batch.submission_budget_s:.0f} s of grading"}
            else:
                found = deciding.run(name[:2], dirs=dirs, since=since, settings=batch.settings,
                                     box=verdict_box,
                                     pythonpath=batch.lib, timeout_s=min(batch.notebook_budget_s, left),
                                     env={"TORCHINDUCTOR_CACHE_DIR": str(dirs.inductor)})
            if "error" in found:
                errors.append(f"verdicts: {found['error']}")
            cells = batch.cells.get(name, {})
            decisions, passed = deciding.score(found, cells, batch.machine)
            deciding.keep(course_root, student, name, found, decisions)
            with course.venv_on_path(), Gradebook(_db_url(course_root)) as gb:
                disagreed = deciding.record(gb, assignment, student, name, passed)
            grades.append(NotebookGrade(student, name, status, 0.0, 0.0, seconds, edited, errors,
                                        verdict_s=float(deciding.finite(found.get("seconds")) or 0.0),
                                        kernel_disagreed=disagreed,
                                        review=[f"{d.check}: {d.note}" for d in decisions.values()
                                                if d.result == "review"],
                                        wall_s=time.perf_counter() - began))
    return grades, before


def _last_error_line(outcome: dict) -> str:
    """The last [ERROR] line nbgrader logged (else the last line of its traceback)."""
    text = (outcome.get("log") or "") + "\n" + (outcome.get("error") or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("[ERROR]")]
    return (errors or lines or ["unknown error"])[-1][:300]


JUDGED = ("check", "measured", "bar", "result", "reason", "note")  # the judge's table, per test cell


def scores_by_check(course_root: Path) -> pd.DataFrame:
    """One row per student and graded cell: its score and the grader's decision on the check(s) it
    requires (:data:`JUDGED`, from ``verdicts/<student>/<notebook>.json``; empty for a person's cell)."""
    from nbgrader.api import Gradebook

    rows = []
    cells = deciding.checks_by_cell(course_root)
    with course.venv_on_path(), Gradebook(_db_url(course_root)) as gb:
        assignment = gb.find_assignment(course.assignment_id(course_root))
        for submission in assignment.submissions:
            for nb in submission.notebooks:
                decided = deciding.kept(course_root, submission.student.id, nb.name)
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
    for column in ("edited_cells", "errors", "kernel_disagreed", "repaired", "review"):
        if column in summary:
            summary[column] = summary[column].map(" | ".join)
    summary.to_csv(paths["grading_summary"], index=False)
    return paths


def grade(course_root: Path = course.COURSE_ROOT, students: list[str] | None = None, *,
          timeout_s: int | None = None, budget_s: float | None = None,
          submission_budget_s: float | None = None, sandboxed: bool = True,
          progress: bool = True) -> list[NotebookGrade]:
    """Autograde, generate feedback and export grades for ``students`` (default: all collected).

    The gradebook must know the release: run ``python -m autograder release`` first (grade does
    it when the gradebook is missing). ``timeout_s`` is the per-cell limit (default: the device
    class's), ``budget_s`` a notebook's wall clock (default: NOTEBOOK_BUDGET_CELLS cell limits),
    ``submission_budget_s`` all of a submission's (default: SUBMISSION_BUDGET_CELLS cell limits);
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
    if submission_budget_s:
        batch.submission_budget_s = submission_budget_s
    if not sandboxed:
        batch.box = batch.memory = "--no-sandbox was given"
    print(f"grading {len(students)} submission(s) on {machine.device_name} ({machine.device_class}), "
          f"{timeout_s} s per cell at most, {batch.notebook_budget_s:.0f} s per notebook, "
          f"{batch.submission_budget_s:.0f} s per submission, "
          + ("each in its own sandbox (bubblewrap)" if batch.box is None else
             f"WITHOUT a sandbox: {batch.box}. Students' code then runs with the grader's rights: "
             "grade as root with bubblewrap installed (apt-get install bubblewrap)"))
    if batch.box is None:
        print(f"memory: {sandbox.memory_bytes() / 2**30:.1f} GiB per sandbox" if batch.memory is None else
              f"note: NO memory limit per sandbox ({batch.memory}); only the address-space limit applies")
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
    for student in students:
        course.check_student_id(student)
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
    """One row per student: score, max (all points), automatic max (the grader's), checks held for
    review, and which notebooks timed out, failed or were missing."""
    frame = pd.DataFrame([asdict(g) for g in grades])
    rows = []
    for student, group in frame.groupby("student", sort=True):
        def named(status):
            return ", ".join(group.loc[group.status == status, "notebook"]) or ""
        rows.append({"student": student, "score": group.score.sum(), "max": group.max_score.sum(),
                     # what the grader decides; the rest (06's written analysis) is a person's to give
                     "automatic max": group.auto_max_score.sum(),
                     "for review": "; ".join(f"{n}: {r}" for n, rs in zip(group.notebook, group.review) for r in rs),
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
    held = [(g.student, r) for g in grades for r in g.review]
    if held:
        print(f"\n{len(held)} check(s) held for review, 0 points until you decide (a manual score in "
              "nbgrader's formgrader gives them):")
        for student, why in held:
            print(f"  {student}: {why}")
    root = course.shown(course_root)
    print(f"grades: {root}/grades.csv, per check: {root}/grades_by_check.csv, "
          f"summary: {root}/grading_summary.csv, feedback: {root}/feedback/<student>/, "
          f"the grader's verdicts: {root}/verdicts/<student>/")
