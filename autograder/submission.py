"""One submission graded: its folders and sandboxes, each notebook run by nbgrader and judged.

:func:`grade_student` is what :func:`.grade.grade` does for each student, and what a Slurm or
``--jobs`` task does for its one (:mod:`.tasks`). For each graded notebook, in lab order:

1. Look for edited read-only cells (test cells, the graded-checks cell, the setup cell) by
   comparing them with the gradebook's record of the release. nbgrader restores them before it
   runs anything; the change is reported in the summary.
2. nbgrader's autograde runs the notebook (:mod:`.autograding`), its kernel in the submission's
   sandbox (:mod:`.sandbox`: no network, no view of the course, the gradebook or other students,
   bounded processes, disk, output and wall clock).
3. The judge re-runs its graded checks (:mod:`.verdicts`), driving the student's code in a
   worker of its own; root decides each check (:mod:`.deciding`) and the gradebook records it. The judge measures each rung of the
   ladder into the grader's results store, which 06's checks read: what 06 grades is what the
   grader measured for 01-05 of the same submission, minutes earlier.

Then the gradebook is checked (:func:`.deciding.restore`: another student's grades, extra
credit nobody gave, a score above its maximum are put back), the feedback is generated, and what
the grader keeps (the results store, the exported report) is copied out through
:mod:`.boundary` (root follows no link a sandbox left). The submission's own folders,
``sandbox/students/<student>/`` (a size-limited tmpfs where it can be mounted), are removed.
What every submission of a batch shares, and where its folders lie: :mod:`.batch`.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import nbformat

from nbgrader.preprocessors import Execute, SaveAutoGrades

from labsupport.grading import MEASURED_BY_THE_GRADER, cgroups

from . import (boundary, course, deciding, gradebook, kernel, sandbox, sandbox_disk, sandbox_memory, sandbox_users,
               skipping, stopping, verdicts)
from .autograding import BoundedExecute, WithheldAutoGrades, cell_errors
from .batch import Batch, Folders
from .course import Course

# A submission's tmpfs: its disk quota (the watchdog stops it there) and room to be stopped in.
DISK_HEADROOM = 1.25


@dataclass
class NotebookGrade:
    """How one notebook of one submission was graded (one row of grading_summary.csv)."""

    student: str
    notebook: str
    status: str  # "graded", "timed out", "failed to run", "missing", "out of time" or NOT_GRADED
    score: float
    max_score: float
    seconds: float = 0.0
    edited_cells: list[str] = field(default_factory=list)  # read-only cells the student changed
    errors: list[str] = field(default_factory=list)  # cells that raised: "cell id: Error: message"
    needs_manual: bool = False  # a manually graded cell (06's analysis) awaits the instructor
    verdict_s: float = 0.0  # seconds the grader's verdict process took
    repaired: list[str] = field(default_factory=list)  # gradebook entries put back after this notebook
    review: list[str] = field(default_factory=list)  # checks held for a person, with their figures
    wall_s: float = 0.0  # this notebook's grading from start to recorded: kernel, verdict and the rest
    auto_max_score: float = 0.0  # the points the grader decides (max_score less the manual ones)
    peak_bytes: int | None = None  # the submission's sandboxes' peak memory while this notebook ran and was judged
    interrupted: bool = False  # the batch this row was graded in was stopped (SIGINT, SIGTERM) before its end


# A notebook the grader had not decided when the batch was stopped: 0 points, graded again by the next `grade`.
NOT_GRADED = "not graded"


def _skipped(path: Path, skips: tuple[set[str], set[str]] | None) -> set[str]:
    """The cells of the handed-in notebook ``path`` the kernel need not run (:mod:`.skipping`):
    none where the notebook cannot be read (autograde then says why)."""
    if not skips:
        return set()
    try:
        return skipping.to_skip(nbformat.read(path, as_version=4), *skips)
    except Exception:  # an unreadable notebook runs whole, and fails as it would
        return set()


def _give_rungs(dirs: Folders, owner: int | None) -> None:
    """The rungs the grader has measured so far (root's, in ``judged/``), into the kernel's results
    store, over whatever an earlier kernel recorded there: the ladder a kernel shows and exports
    (06's report, 07's) is the grader's, as 06 grades it, and the rung cells a graded kernel leaves
    out (:mod:`.skipping`) leave it no gap. No sandboxed process runs while root writes."""
    from labsupport import notebooks

    for nb in notebooks.rungs():
        name = f"{nb.stage}.json"
        if (dirs.judged / name).is_file():
            try:
                boundary.give(dirs.results, name, (dirs.judged / name).read_bytes(), owner)
            except boundary.Refused:
                pass  # the kernel left a folder of that name: its own ladder misses the rung




def grade_student(where: Course | Path, student: str, *, timeout_s: int,
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
    from nbgrader.converters import Autograde

    the = course.of(where)
    batch = batch or Batch.prepare(the, timeout_s)
    folder = the.submitted(student)
    names = course.lab_order(p.stem for p in course.graded_masters(the.root))
    kept = the.results(student)  # the grader's measurements, copied out at the end
    dirs = Folders(batch.course.root / "sandbox" / "students" / student)
    sandbox_disk.unmount_below(dirs.work)
    for path in (kept, dirs.work, the.verdicts(student)):
        shutil.rmtree(path, ignore_errors=True)
    deadline = time.monotonic() + batch.submission_budget_s
    grades: list[NotebookGrade] = []  # one per notebook decided, appended as each is
    with the.gradebook() as gb:
        before = deciding.snapshot(gb, the.assignment)
    group = _submission_group(batch)
    try:
        _grade_in(the, student, batch, dirs, folder, names, deadline, Autograde, grades, group)
        with the.gradebook() as gb:
            repaired = deciding.restore(gb, the.assignment, student, before)
        gradebook.feedback(the, student)
        try:
            (the.root / "reports").mkdir(exist_ok=True)
            boundary.copy_file(dirs.report, "report.html", the.root / "reports" / f"{student}.html")
        except OSError:
            pass  # no report exported (06 did not run, or wrote something else): the summary says so
        if dirs.store.is_dir():
            skipped = boundary.copy_tree(dirs.store, kept)
            if skipped and grades:
                grades[0].errors.append(f"results not kept: {'; '.join(skipped[:5])}")
        if dirs.judged.is_dir():  # the judge's own files (root's), over whatever the store held of them
            shutil.copytree(dirs.judged, kept, dirs_exist_ok=True)
    except stopping.Stopped as stop:
        _end(group, batch)  # nothing of this submission runs on while the gradebook is put right
        stop.grades = _stopped(the, student, batch, [n for n in names if (folder / f"{n}.ipynb").exists()],
                               grades, before, stop.signum)
        raise
    finally:
        _end(group, batch)
        sandbox_disk.unmount_below(dirs.work)
        shutil.rmtree(dirs.work, ignore_errors=True)
    scores = gradebook.notebook_scores(the, student)
    for g in grades:
        g.score, g.max_score, g.needs_manual, g.auto_max_score = scores.get(g.notebook, (0.0, g.max_score, False, 0.0))
        g.repaired = [r for r in repaired if g.notebook in r]
    if grades:  # a repair that names none of this student's notebooks goes on the first row
        grades[0].repaired += [r for r in repaired if not any(g.notebook in r for g in grades)]
    return grades


def _submission_group(batch: Batch) -> cgroups.Group | None:
    """The cgroup v2 group every sandbox of the submission runs in (its kernels and verdict
    processes; :func:`sandbox_users.kill_all` ends it as a whole): made empty, below this grader's
    (:func:`sandbox_memory.group_path`); None without a sandbox, or where no group can be made (then the
    pid walk of :func:`sandbox_users.kill_all` alone ends them)."""
    if batch.box is not None or cgroups.problem():
        return None
    try:
        group = cgroups.Group(sandbox_memory.group_path("submission"))
        group.remove()  # what a grader that was killed outright left in it
        group = cgroups.Group.make(group.path)
    except (cgroups.CgroupError, OSError):
        return None
    sandbox_users.track(group.path)
    return group


def _end(group: cgroups.Group | None, batch: Batch) -> None:
    """End every process of the submission's sandboxes (its group by ``cgroup.kill``, then what
    the pid walk finds), reap them, and remove its group."""
    if batch.box is None:
        sandbox_users.kill_all()
    if group is not None:
        group.remove()
        sandbox_users.untrack(group.path)


def _stopped(the: Course, student: str, batch: Batch, names: list[str], grades: list[NotebookGrade],
             before: dict, signum: int) -> list[NotebookGrade]:
    """``grades`` (the notebooks decided before the batch was stopped by ``signum``), scored as the
    gradebook has them, then a NOT_GRADED row, at 0 in the gradebook too, for every other notebook
    of ``names`` (those handed in: the one being graded, and those after it; an earlier grading's
    marks are no grade of this submission); the gradebook is checked as after a whole submission
    (:func:`deciding.restore`)."""
    import signal

    decided = {g.notebook for g in grades}
    why = (f"not graded: the batch was stopped ({signal.Signals(signum).name}) before the grader decided "
           "this notebook; `python -m autograder grade` grades it again")
    rest = [NotebookGrade(student, name, NOT_GRADED, 0.0, 0.0, errors=[why]) for name in names if name not in decided]
    with the.gradebook() as gb:
        for g in rest:
            deciding.record(gb, the.assignment, student, g.notebook, dict.fromkeys(batch.cells.get(g.notebook, {}), False))
        repaired = deciding.restore(gb, the.assignment, student, before)
    scores = gradebook.notebook_scores(the, student)
    for g in grades + rest:
        score, g.max_score, g.needs_manual, g.auto_max_score = scores.get(g.notebook, (0.0, g.max_score, False, 0.0))
        g.score = 0.0 if g.status == NOT_GRADED else score
    if grades + rest:
        (grades + rest)[0].repaired += repaired
    return grades + rest


def _grade_in(the: Course, student: str, batch: Batch, dirs: Folders, folder: Path, names: list[str],
              deadline: float, Autograde, grades: list[NotebookGrade], group: cgroups.Group | None) -> None:
    """Run and judge each notebook of ``student`` in ``dirs``, appending its NotebookGrade to
    ``grades`` once the grader has recorded its decisions; every sandbox in ``group``."""
    sandboxed = batch.box is None
    dirs.work.mkdir(parents=True)
    if sandboxed and batch.disk is None:
        why = sandbox_disk.mount_disk(dirs.work, int(sandbox_disk.STORE_BYTES * DISK_HEADROOM))
        if why:  # said once for the batch: the watchdog counts files instead
            batch.disk = f"no size-limited filesystem per submission ({why})"
            print(f"note: {batch.disk}; the watchdog counts each submission's files instead")
    disk = dirs.work if sandboxed and batch.disk is None else None
    dirs.fresh("results", "report", "inductor", "store", "outbox", owned=sandboxed)
    dirs.fresh("judged", "connection", owned=False)
    dirs.connection.chmod(0o700)
    shutil.copytree(folder, dirs.cwd)  # the kernel's working folder: the submission as handed in
    if sandboxed:
        sandbox_users.own(dirs.cwd)
    kernel_report = dirs.report / "report.html"
    autograded = the.autograded(student)
    env = {"LAB_RESULTS": str(dirs.results), "LAB_REPORT": str(kernel_report),
           # the batch's copy, which the sandbox can read (the course root is not in it)
           "LAB_CALIBRATION": batch.settings["calibration"] or os.devnull,
           "LAB_THRESHOLDS": batch.settings["thresholds"],  # the batch's copy, for the grader's decisions too
           "JUPYTER_RUNTIME_DIR": str(dirs.run), "JUPYTER_PATH": str(dirs.jupyter),
           # The judge measures every check after the kernel: the kernel's self-check does not.
           MEASURED_BY_THE_GRADER: "1",
           # One Inductor cache per submission, shared by its kernels and verdict processes (never
           # between submissions): the verdict re-uses what the kernel compiled for the same code.
           "TORCHINDUCTOR_CACHE_DIR": str(dirs.inductor)}
    readable = (batch.lib, Path(batch.settings["data"]), Path(batch.settings["thresholds"]).parent)
    box = verdict_box = None
    joined = group.path if group is not None else None
    if sandboxed:
        box = sandbox.Sandbox(writable=(dirs.results, dirs.run, dirs.report, dirs.inductor),
                              readable=readable + (dirs.connection,),
                              env={"PYTHONPATH": str(batch.lib), "TORCHINDUCTOR_CACHE_DIR": str(dirs.inductor)},
                              mounts=((dirs.cwd, autograded),), group=joined)
        verdict_box = sandbox.Sandbox(writable=(dirs.store, dirs.outbox, dirs.inductor),
                                      readable=readable + (dirs.report, dirs.inputs), group=joined)
    written = (dirs.results, dirs.cwd, dirs.report, dirs.inductor, dirs.run)  # where the kernel writes
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
                edited = gradebook.edited_cells(path, name, the)
            except Exception as err:  # an unreadable notebook: autograde reports it below
                edited = [f"(could not compare: {type(err).__name__}: {err})"]
            # "immediate": the kernel is killed once its last cell has replied, not asked to run its
            # exit hooks (about 2 s of tearing torch down, per notebook).
            settings = dict(Execute__timeout=max(1, int(min(batch.timeout_s, left))),
                            Execute__shutdown_kernel="immediate",
                            BoundedExecute__skipped=sorted(_skipped(path, batch.skips.get(name))))
            dirs.fresh("run", owned=sandboxed)  # what the last kernel left there is gone
            _give_rungs(dirs, sandbox_users.user() if sandboxed else None)
            if box is not None:
                kernel.spec(dirs.jupyter, replace(box, budget_s=min(batch.notebook_budget_s, left)),
                            dirs.run / "kernel.log")
                settings.update(kernel.settings(dirs.run, dirs.connection))
            cells = batch.cells.get(name, {})
            app = gradebook.app(Autograde, the, CourseDirectory__student_id=student,
                       CourseDirectory__notebook_id=name, Autograde__create_student=True,
                       WithheldAutoGrades__withheld=sorted(cells), **settings)
            # the config's stand-in (nbgrader autograde alone refuses to grade) becomes the sandboxed run,
            # and the kernel's marks of the grader's cells are withheld (0 until the judge's are recorded)
            app.autograde_preprocessors = [
                BoundedExecute if pp is Execute or getattr(pp, "replaced_by_the_grader", False) else
                WithheldAutoGrades if pp is SaveAutoGrades else pp for pp in app.autograde_preprocessors]
            started, since = time.perf_counter(), time.time()
            kills = sandbox_memory.memory_kills()
            memory = sandbox_memory.MemoryPeak()
            with sandbox_disk.watchdog(written, enabled=sandboxed, disk=disk) as dog:
                outcome = gradebook.run(app)
            if sandboxed:
                sandbox_users.kill_all()  # nothing the notebook started outlives it (its group, then the pid walk)
            stopping.check()  # nbgrader's app swallows the signal's exception: it stops the batch here
            seconds = time.perf_counter() - started
            errors, timed_out = cell_errors(autograded / f"{name}.ipynb")
            if not outcome["success"]:
                status = "failed to run"
                errors.append(gradebook.last_error_line(outcome))
            else:
                status = "timed out" if timed_out else "graded"
            if sandbox_memory.memory_kills() > kills:
                errors.append(f"the notebook used more than {sandbox_memory.memory_bytes() / 2**30:.1f} GiB of memory: "
                              "the sandbox's limit stopped it")
            if dog.tripped or (sandboxed and sandbox_disk.disk_used(written, disk) > sandbox_disk.STORE_BYTES):
                errors.append(f"the notebook wrote more than {sandbox_disk.STORE_BYTES / 2**20:.0f} MiB to disk: "
                              "it was stopped, and what it wrote was deleted")
                dirs.fresh("results", "cwd", "report", "inductor", owned=sandboxed)
            left = deadline - time.monotonic()
            if left < 1:
                found = {"error": "no time was left for the verdict process: the submission used its "
                                  f"{batch.submission_budget_s:.0f} s of grading"}
            else:
                found = verdicts.run(name[:2], dirs=dirs, since=since, settings=batch.settings,
                                     box=verdict_box,
                                     pythonpath=batch.lib, worker_pythonpath=batch.worker_lib,
                                     timeout_s=min(batch.notebook_budget_s, left),
                                     env={"TORCHINDUCTOR_CACHE_DIR": str(dirs.inductor)})
            if "error" in found:
                errors.append(f"verdicts: {found['error']}")
            decisions, passed = deciding.score(found, cells, batch.machine)
            deciding.keep(the, student, name, found, decisions)
            with the.gradebook() as gb:
                deciding.record(gb, the.assignment, student, name, passed)
            grades.append(NotebookGrade(student, name, status, 0.0, 0.0, seconds, edited, errors,
                                        verdict_s=float(deciding.finite(found.get("seconds")) or 0.0),
                                        review=[f"{d.check}: {d.note}" for d in decisions.values()
                                                if d.result == "review"],
                                        wall_s=time.perf_counter() - began, peak_bytes=memory.read()))


