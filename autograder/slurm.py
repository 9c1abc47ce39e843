"""Grade a class on a Slurm cluster: one submission per array task, merged back into nbgrader.

Speed is measured, so a submission needs its GPU (or node) to itself, and one machine grades one
submission at a time: 200 students at about 4.5 minutes each take 15 hours. On a cluster they
run side by side. ``python -m autograder grade --backend slurm`` writes a job folder,
``<course>/slurm/`` by default, and with ``--submit`` submits it:

- ``students.txt``: the students, one per line; array task ``i`` grades line ``i + 1``.
- ``calibrate.sbatch``: the dataset, then ``calibrate`` on the same kind of node as the tasks
  (same partition, constraint and GPU request), since the bars are that machine's.
- ``grade.sbatch``: the job array, one student per task, each with one whole GPU
  (``--gres=gpu:1``) or a whole node (``--exclusive``), at most ``--max-running`` at once.
- ``merge.sbatch``: ``python -m autograder merge``, after every task, whatever each one did.
- ``submit.sh``: submits the three, the array ``afterok`` the calibration and the merge
  ``afterany`` the array; ``bash submit.sh 3,7`` regrades tasks 3 and 7 only, then merges.

They are plain scripts, written to be read and edited. Each task (:func:`run_task`) grades its
student exactly as ``grade`` does locally, sandbox included, in a private copy of the course on
the node's local disk (``TMPDIR``): its own gradebook, sandbox folders and compile caches, so
tasks share nothing but the read-only course, dataset and code. It leaves its student's graded
files and a ``task.json`` (its grades, start, end, node and GPU) in ``tasks/<student>/``.

The merge (:func:`merge`) copies each task's gradebook entries into the course's gradebook
through nbgrader's API, brings back the autograded notebooks, measurements and reports,
regenerates the feedback, the CSVs and the class report, and names every task that failed or
left no result. ``grade --backend slurm --rerun --submit`` regrades exactly those, in one command.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shlex
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from . import course

JOB_DIR = "slurm"  # in the course root
# The environment a task inherits from the instructor's shell at writing time and must keep: the
# lab's settings, and the CPU kind a run may simulate. Written into the scripts as exports.
CARRIED_ENV = ("LAB_PROFILE", "LAB_DATA", "LAB_CALIBRATION", "LAB_THRESHOLDS", "LAB_DEVICE",
               "ONEDNN_MAX_CPU_ISA")


@dataclass
class Options:
    """How the array asks Slurm for machines (the ``grade --backend slurm`` options)."""

    partition: str | None = None  # every task on one GPU type: a partition ...
    constraint: str | None = None  # ... and/or a node feature (e.g. a100)
    exclusive: bool = False  # a whole node per task, instead of one GPU
    max_running: int = 8  # tasks at once (the array's %N)
    cpus_per_task: int | None = None  # CPUs beside the GPU (None: the partition's default)
    time: str = "03:00:00"  # per task; a submission takes minutes, a hostile one its budgets
    calibrate_runs: int | None = 3  # None: keep the course's calibration, submit no calibration job
    timeout_s: int | None = None  # grade's per-cell limit (default: the device class's)

    def resources(self) -> list[str]:
        """The ``#SBATCH`` options that pick the machine, shared by the calibration and the array."""
        lines = ["--exclusive" if self.exclusive else "--gres=gpu:1"]
        lines += [f"--cpus-per-task={self.cpus_per_task}"] if self.cpus_per_task else []
        lines += [f"--partition={self.partition}"] if self.partition else []
        lines += [f"--constraint={self.constraint}"] if self.constraint else []
        return lines


def job_dir(course_root: Path) -> Path:
    return Path(course_root).resolve() / JOB_DIR


# --- writing and submitting ---------------------------------------------------------------------

def write(course_root: Path, students: list[str], options: Options, job: Path | None = None) -> Path:
    """Write the job folder (students.txt, the sbatch scripts, submit.sh); returns it.

    A folder from an earlier term's grading is replaced, task results included.
    """
    course_root = Path(course_root).resolve()
    job = Path(job or job_dir(course_root)).resolve()
    if job.exists():
        shutil.rmtree(job)
    (job / "logs").mkdir(parents=True)
    write_students(job, students)
    python = Path(sys.executable)
    run = [str(python), "-m", "autograder", "--course", str(course_root)]
    when = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    exports = [f"export {k}={shlex.quote(os.environ[k])}" for k in CARRIED_ENV if os.environ.get(k)]
    head = ["#!/bin/bash"]
    preamble = ["set -euo pipefail", f"cd {shlex.quote(str(course.REPO_ROOT))}", *exports]

    def script(name: str, comment: list[str], sbatch: list[str], body: list[str]) -> None:
        text = [*head, *(f"# {c}" for c in comment), *(f"#SBATCH {o}" for o in sbatch), "", *preamble, *body]
        path = job / name
        path.write_text("\n".join(text) + "\n")
        path.chmod(0o755)

    origin = f"Written by `python -m autograder grade --backend slurm` on {when}; edit freely."
    timeout = [f"--timeout={options.timeout_s}"] if options.timeout_s else []
    calibrate = options.calibrate_runs is not None
    if calibrate:
        script("calibrate.sbatch",
               [origin, "The bars of this kind of node: the dataset, then the reference's checks",
                f"{options.calibrate_runs} times (autograder/calibrate.py). The array starts after it succeeds."],
               ["--job-name=lab-calibrate", *options.resources(), f"--time={options.time}",
                f"--output={job / 'logs' / 'calibrate-%j.out'}"],
               [f"{shlex.quote(str(python))} -m labsupport data",
                shlex.join([*run, "calibrate", f"--runs={options.calibrate_runs}"])])
    last = len(students) - 1
    script("grade.sbatch",
           [origin, f"One student per array task (students.txt, line task id + 1), {len(students)} in all,",
            f"at most {options.max_running} at once, each on "
            + ("a whole node." if options.exclusive else "one whole GPU."),
            "Each grades exactly as `python -m autograder grade <student>` on that node would."],
           ["--job-name=lab-grade", f"--array=0-{last}%{options.max_running}", *options.resources(),
            f"--time={options.time}", f"--output={job / 'logs' / 'grade-%A_%a.out'}"],
           [f"student=$(sed -n \"$((SLURM_ARRAY_TASK_ID + 1))p\" {shlex.quote(str(job / 'students.txt'))})",
            "exec " + shlex.join([*run, "grade-task", f"--job={job}", *timeout]) + ' "$student"'])
    script("merge.sbatch",
           [origin, "After the array, whatever each task did: every task's grades into the gradebook,",
            "then the feedback, the CSVs and the class report (python -m autograder merge)."],
           ["--job-name=lab-merge", *[o for o in options.resources() if o.startswith("--partition")],
            "--time=01:00:00", f"--output={job / 'logs' / 'merge-%j.out'}"],
           ["exec " + shlex.join([*run, "merge", f"--job={job}"])])
    cap = options.max_running
    submit = [
        "#!/bin/bash",
        f"# {origin}",
        "# Submits the grading: " + ("the calibration, then " if calibrate else "")
        + "the array" + (" (afterok)" if calibrate else "") + ", then the merge (afterany).",
        "# With an argument, regrades only those array tasks (e.g. 3,7) and merges again:",
        "# `python -m autograder grade --backend slurm --rerun --submit` passes the failed and missing ones.",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        'jobid() { echo "${1%%;*}"; }  # sbatch --parsable prints "jobid[;cluster]"',
        'if [ $# -eq 0 ]; then',
        *(['  calibration=$(jobid "$(sbatch --parsable calibrate.sbatch)")',
           '  array=$(jobid "$(sbatch --parsable --dependency=afterok:$calibration grade.sbatch)")']
          if calibrate else ['  array=$(jobid "$(sbatch --parsable grade.sbatch)")']),
        'else',
        f'  array=$(jobid "$(sbatch --parsable --array="$1%{cap}" grade.sbatch)")',
        'fi',
        'merge=$(jobid "$(sbatch --parsable --dependency=afterany:$array merge.sbatch)")',
        'echo "calibration ${calibration:-none}, grading array $array, merge $merge"',
    ]
    (job / "submit.sh").write_text("\n".join(submit) + "\n")
    (job / "submit.sh").chmod(0o755)
    return job


def submit(job: Path, tasks: list[int] | None = None) -> str:
    """Run submit.sh (for ``tasks`` only, when given); returns what it printed."""
    if shutil.which("sbatch") is None:
        raise course.CourseError(f"sbatch is not on PATH: submit from a Slurm login node with "
                                 f"`bash {job / 'submit.sh'}`.")
    argv = ["bash", str(Path(job) / "submit.sh")] + ([",".join(map(str, tasks))] if tasks else [])
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise course.CourseError(f"submit.sh failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout.strip()


def write_students(job: Path, students: list[str]) -> None:
    """The job's ``students.txt``: one student per line; task ``i`` grades line ``i + 1``."""
    (Path(job) / "students.txt").write_text("".join(f"{s}\n" for s in students))


def students_of(job: Path) -> list[str]:
    path = Path(job) / "students.txt"
    if not path.is_file():
        raise course.CourseError(f"{path} does not exist: write the job first with "
                                 "`python -m autograder grade --backend slurm`.")
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def unfinished(job: Path) -> list[int]:
    """The array tasks whose student has no result, or whose grading failed (to run again)."""
    out = []
    for i, student in enumerate(students_of(job)):
        record = read_task(job, student)
        if record is None or record.get("status") != "graded":
            out.append(i)
    return out


# --- one array task ------------------------------------------------------------------------------

# What a task brings back from its private course, and the merge puts into the course.
BROUGHT_BACK = ("autograded/{s}", "results/{s}", "reports/{s}.html", "verdicts/{s}")


def run_task(course_root: Path, job: Path, student: str, *, timeout_s: int | None = None) -> dict:
    """Grade ``student`` in a private copy of the course on this node; leave the result in the job.

    Writes ``tasks/<student>/``: ``task.json`` (status, grades, start, end, node, cores, GPU, Slurm
    ids), the private gradebook (``gradebook.db``) and the student's graded files. Returns the
    record; its status is "graded", or "failed" with the error.
    """
    from labsupport.hardware import describe_machine

    from . import grade, sandbox

    course_root, job = Path(course_root).resolve(), Path(job).resolve()
    task = job / "tasks" / student
    shutil.rmtree(task, ignore_errors=True)
    task.mkdir(parents=True)
    record = {"student": student, "status": "failed", "started": time.time(), "host": socket.gethostname(),
              "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "no_sandbox": sandbox.problem(),
              "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
              "sandbox_user": sandbox.user(),
              "device": f"{describe_machine().device_name} ({describe_machine().device_class})",
              "slurm": {k: os.environ.get(k) for k in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID",
                                                       "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST")}}
    # Node-local: sqlite wants a local disk, and the kernels' ipc sockets a short path.
    scratch = Path(tempfile.mkdtemp(prefix="lab-grade-"))
    try:
        private = _private_course(course_root, student, scratch / "course")
        grades = grade.grade(private, [student], timeout_s=timeout_s, progress=False)
        print(grade.summary(grades).to_string())  # into the task's log
        record["grades"] = [asdict(g) for g in grades]
        failed = [g for g in grades if g.status == "failed to grade"]
        record["status"] = "failed" if failed else "graded"
        record["error"] = "; ".join(e for g in failed for e in g.errors) or None
        shutil.copyfile(private / "gradebook.db", task / "gradebook.db")
        _bring_back(private, task, student)
    except Exception as err:  # the task fails, with the reason in task.json and the log; the merge goes on
        where = traceback.extract_tb(err.__traceback__)[-1]
        record["error"] = f"{type(err).__name__}: {str(err)[:300]} ({Path(where.filename).name}:{where.lineno})"
        traceback.print_exc()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        record["ended"] = time.time()
        partial = task / "task.json.partial"
        partial.write_text(json.dumps(record, indent=1))
        partial.replace(task / "task.json")  # the merge never reads half a record
    return record


def _bring_back(source_root: Path, target_root: Path, student: str) -> None:
    """``student``'s graded files (BROUGHT_BACK) from one folder to another, replacing what was there."""
    for pattern in BROUGHT_BACK:
        source, target = source_root / pattern.format(s=student), target_root / pattern.format(s=student)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True)
        elif source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)


def _private_course(course_root: Path, student: str, dest: Path) -> Path:
    """A course of its own for one task: the config, source, release, a copy of the gradebook (the
    release's record: what autograde checks the notebooks against), the calibration, and this
    student's submission."""
    dest.mkdir(parents=True)
    shutil.copyfile(course_root / course.CONFIG_NAME, dest / course.CONFIG_NAME)
    for folder in ("source", "release"):
        if (course_root / folder).is_dir():
            shutil.copytree(course_root / folder, dest / folder)
    _copy_gradebook(course_root / "gradebook.db", dest / "gradebook.db")
    calibration = course_root / "calibration.toml"
    if calibration.is_file():
        shutil.copyfile(calibration, dest / "calibration.toml")
    shutil.copytree(course_root / "submitted" / student, dest / "submitted" / student)
    return dest


def _copy_gradebook(source: Path, dest: Path) -> None:
    """A consistent copy of a gradebook, even while another grader writes to it (sqlite's backup)."""
    with contextlib.closing(sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True)) as theirs, \
            contextlib.closing(sqlite3.connect(dest)) as ours:
        theirs.backup(ours)


def read_task(job: Path, student: str) -> dict | None:
    path = Path(job) / "tasks" / student / "task.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# --- the merge -----------------------------------------------------------------------------------

def merge(course_root: Path, job: Path | None = None) -> dict:
    """Merge every task's result into the course: gradebook, files, feedback, CSVs, class report.

    Returns ``{"merged": [...], "failed": {student: why}, "missing": [...], "grades": [...],
    "report": class report, "no_sandbox": {student: why their task had none},
    "devices": {device: [students graded on it]}}``.
    """
    from . import grade, reports

    course_root = Path(course_root).resolve()
    job = Path(job or job_dir(course_root)).resolve()
    merged, failed, missing, grades, unboxed, devices = [], {}, [], [], {}, {}
    for student in students_of(job):
        record = read_task(job, student)
        if record is None:
            missing.append(student)
            grades.append(grade.NotebookGrade(student, "", "failed to grade", 0.0, 0.0, errors=[
                "its grading task left no result (not run yet, cancelled, or out of time: see logs/)"]))
            continue
        if record["status"] != "graded":
            failed[student] = record.get("error") or "unknown error"
            grades.append(grade.NotebookGrade(student, "", "failed to grade", 0.0, 0.0,
                                              errors=[f"its grading task failed: {failed[student]}"]))
            continue
        task = job / "tasks" / student
        _merge_gradebook(course_root, task / "gradebook.db", student)
        _bring_back(task, course_root, student)
        grade.feedback(course_root, student)
        grades += [grade.NotebookGrade(**g) for g in record["grades"]]
        merged.append(student)
        if record.get("no_sandbox"):
            unboxed[student] = record["no_sandbox"]
        devices.setdefault(record.get("device"), []).append(student)
    grade.export(course_root, grades)
    report = reports.class_report(course_root) if merged else None
    return {"merged": merged, "failed": failed, "missing": missing, "grades": grades, "report": report,
            "no_sandbox": unboxed, "devices": devices}


def _merge_gradebook(course_root: Path, task_db: Path, student: str) -> None:
    """Copy ``student``'s submission (every column of its grades, comments, notebooks) from a task's gradebook
    into the course's, replacing what the course's held for them. Nothing of any other student's
    is read or written: a task's gradebook speaks only for its own student."""
    from nbgrader.api import Gradebook, MissingEntry

    from . import grade

    assignment = course.assignment_id(course_root)
    with course.venv_on_path(), Gradebook(f"sqlite:///{task_db}") as theirs, \
            Gradebook(grade._db_url(course_root)) as ours:
        sub = theirs.find_submission(assignment, student)
        person = sub.student
        ours.update_or_create_student(student, **{c.key: getattr(person, c.key) for c in
                                                  type(person).__table__.columns if not c.primary_key})
        try:
            ours.remove_submission(assignment, student)
        except MissingEntry:
            pass
        target = ours.add_submission(assignment, student)
        _copy_columns(sub, target)
        for nb in sub.notebooks:
            _copy_columns(nb, ours.find_submission_notebook(nb.name, assignment, student))
            for g in nb.grades:
                _copy_columns(g, ours.find_grade(g.name, nb.name, assignment, student))
            for c in nb.comments:
                _copy_columns(c, ours.find_comment(c.name, nb.name, assignment, student))
        ours.db.commit()


def _copy_columns(source, target) -> None:
    """Every column of a gradebook row but its keys (scores, extra credit, needs-manual-grade,
    comments, flags, timestamp): the whole of what nbgrader stores, whatever its version adds."""
    for column in type(source).__table__.columns:
        if not column.primary_key and not column.foreign_keys:
            setattr(target, column.key, getattr(source, column.key))


def print_merge(outcome: dict, course_root: Path, job: Path,
                again: str = "python -m autograder grade --backend slurm --rerun --submit") -> None:
    """The merge's summary: the class table, then what failed or is missing and how to rerun it."""
    from . import grade

    if outcome["grades"]:
        grade.print_summary(outcome["grades"], course_root)
    print(f"\nmerged {len(outcome['merged'])} task(s) into {course.shown(course_root)}/gradebook.db"
          + (f"; class report: {course.shown(outcome['report'])}" if outcome["report"] else ""))
    if len(outcome["devices"]) > 1:
        print("the tasks ran on different devices, so their bars differ (calibration.toml holds one "
              "machine's): " + "; ".join(f"{d}: {len(s)} student(s)" for d, s in outcome["devices"].items())
              + ". Pin one GPU type with --partition or --constraint, and grade again.")
    if outcome["no_sandbox"]:
        reasons = sorted(set(outcome["no_sandbox"].values()))
        print(f"WITHOUT a sandbox: {len(outcome['no_sandbox'])} task(s) ({'; '.join(reasons)}): their students' "
              "code ran with the job's rights (autograder/sandbox.py)")
    for student, why in outcome["failed"].items():
        print(f"failed: {student}: {why}")
    for student in outcome["missing"]:
        print(f"no result: {student} (see {course.shown(job)}/logs/)")
    if outcome["failed"] or outcome["missing"]:
        print(f"grade them again (only them) with: {again}")
