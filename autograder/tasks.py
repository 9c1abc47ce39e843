"""A submission graded as a task of its own, and the merge of tasks into the course.

A grading task grades one student exactly as ``grade`` does locally, sandbox included, in a
private copy of the course on the machine's local disk (``TMPDIR``): its own gradebook, sandbox
folders and compile caches, so tasks share nothing but the read-only course, dataset and code.
Slurm's array runs them (:mod:`.slurm`), and so does ``grade --jobs N`` on one machine
(:mod:`.parallel`). A job folder holds:

- ``students.txt``: the students, one per line; task ``i`` grades line ``i + 1``.
- ``tasks/<student>/``: what a task left: its student's graded files, its private gradebook and
  ``task.json`` (its grades, start, end, node and GPU).

The merge (:func:`merge`) copies each task's gradebook entries into the course's gradebook
through nbgrader's API, brings back the autograded notebooks, measurements and reports,
regenerates the feedback, the CSVs and the class report, and names every task that failed or
left no result.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from . import course, gradebook
from .course import Course


# --- the job folder -------------------------------------------------------------------------------

def write_students(job: Path, students: list[str]) -> None:
    """The job's ``students.txt``: one student per line; task ``i`` grades line ``i + 1``."""
    (Path(job) / "students.txt").write_text("".join(f"{s}\n" for s in students))


def students_of(job: Path) -> list[str]:
    path = Path(job) / "students.txt"
    if not path.is_file():
        raise course.CourseError(f"{path} does not exist: write the job first with "
                                 "`python -m autograder grade --backend slurm`.")
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def read_task(job: Path, student: str) -> dict | None:
    path = Path(job) / "tasks" / student / "task.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def unfinished(job: Path) -> list[int]:
    """The array tasks whose student has no result, or whose grading failed (to run again)."""
    out = []
    for i, student in enumerate(students_of(job)):
        record = read_task(job, student)
        if record is None or record.get("status") != "graded":
            out.append(i)
    return out


# --- one task -------------------------------------------------------------------------------------

# What a task brings back from its private course, and the merge puts into the course.
BROUGHT_BACK = ("autograded/{s}", "results/{s}", "reports/{s}.html", "verdicts/{s}", "grading_logs/{s}")


# The Slurm variables a task's record keeps: which job, array task and node graded it.
SLURM_IDS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST")


def run_task(where: Course | Path, job: Path, student: str, *, timeout_s: int | None = None,
             gpus: str | None = None, slurm: dict[str, str | None] | None = None) -> dict:
    """Grade ``student`` in a private copy of the course on this node; leave the result in the job.

    ``gpus`` (CUDA_VISIBLE_DEVICES) and ``slurm`` (SLURM_IDS' values) are where the task ran, as
    the command line read them from its environment; kept in the record.

    Writes ``tasks/<student>/``: ``task.json`` (status, grades, start, end, node, cores, GPU, Slurm
    ids), the private gradebook (``gradebook.db``) and the student's graded files. Returns the
    record; its status is "graded", or "failed" with the error, or "interrupted" where a signal
    stopped it (Slurm's SIGTERM at the time limit or on scancel): its sandboxes ended, the record
    written, and :class:`.stopping.Stopped` raised again, so the task exits with 128 + the signal.
    """
    from labsupport.hardware import describe_machine

    from . import grade, sandbox, sandbox_users, stopping

    the, job = course.of(where), Path(job).resolve()
    task = job / "tasks" / student
    shutil.rmtree(task, ignore_errors=True)
    task.mkdir(parents=True)
    record = {"student": student, "status": "failed", "started": time.time(), "host": socket.gethostname(),
              "gpus": gpus, "no_sandbox": sandbox.problem(),
              "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
              "sandbox_user": sandbox_users.user(),
              "device": f"{describe_machine().device_name} ({describe_machine().device_class})",
              "slurm": {k: (slurm or {}).get(k) for k in SLURM_IDS}}
    # Node-local: sqlite wants a local disk, and the kernels' ipc sockets a short path.
    scratch = Path(tempfile.mkdtemp(prefix="lab-grade-"))
    try:
        private = _private_course(the, student, scratch / "course")
        grades = grade.grade(private, [student], timeout_s=timeout_s, progress=False)
        print(grade.summary(grades).to_string())  # into the task's log
        record["grades"] = [asdict(g) for g in grades]
        failed = [g for g in grades if g.status == "failed to grade"]
        record["status"] = "failed" if failed else "graded"
        record["error"] = "; ".join(e for g in failed for e in g.errors) or None
        shutil.copyfile(private / "gradebook.db", task / "gradebook.db")
        _bring_back(private, task, student)
    except stopping.Stopped as stop:  # the rerun grades it again (unfinished)
        record["status"], record["error"] = "interrupted", f"stopped by {stop} before it finished"
        record["grades"] = [asdict(g) for g in stop.grades]
        raise
    except Exception as err:  # the task fails, with the reason in task.json and the log; the merge goes on
        frame = traceback.extract_tb(err.__traceback__)[-1]
        record["error"] = f"{type(err).__name__}: {str(err)[:300]} ({Path(frame.filename).name}:{frame.lineno})"
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


def _private_course(the: Course, student: str, dest: Path) -> Path:
    """A course of its own for one task: the config, source, release, a copy of the gradebook (the
    release's record: what autograde checks the notebooks against), the calibration, and this
    student's submission."""
    dest.mkdir(parents=True)
    shutil.copyfile(the.root / course.CONFIG_NAME, dest / course.CONFIG_NAME)
    for folder in ("source", "release"):
        if (the.root / folder).is_dir():
            shutil.copytree(the.root / folder, dest / folder)
    gradebook.copy_database(the.gradebook_path, dest / "gradebook.db")
    calibration = the.root / "calibration.toml"
    if calibration.is_file():
        shutil.copyfile(calibration, dest / "calibration.toml")
    shutil.copytree(the.root / "submitted" / student, dest / "submitted" / student)
    return dest


# --- the merge ------------------------------------------------------------------------------------

def merge(where: Course | Path, job: Path) -> dict:
    """Merge every task's result into the course: gradebook, files, feedback, CSVs, class report.

    Returns ``{"merged": [...], "failed": {student: why}, "missing": [...], "grades": [...],
    "report": class report, "no_sandbox": {student: why their task had none},
    "devices": {device: [students graded on it]}}``.
    """
    from . import reports
    from .submission import NotebookGrade

    the = course.of(where)
    job = Path(job).resolve()
    merged, failed, missing, grades, unboxed, devices = [], {}, [], [], {}, {}
    for student in students_of(job):
        record = read_task(job, student)
        if record is None:
            missing.append(student)
            grades.append(NotebookGrade(student, "", "failed to grade", 0.0, 0.0, errors=[
                "its grading task left no result (not run yet, cancelled, or out of time: see logs/)"]))
            continue
        if record["status"] != "graded":
            failed[student] = record.get("error") or "unknown error"
            grades.append(NotebookGrade(student, "", "failed to grade", 0.0, 0.0,
                                              errors=[f"its grading task failed: {failed[student]}"]))
            continue
        task = job / "tasks" / student
        gradebook.merge_submission(the, task / "gradebook.db", student)
        _bring_back(task, the.root, student)
        gradebook.feedback(the, student)
        grades += [NotebookGrade(**g) for g in record["grades"]]
        merged.append(student)
        if record.get("no_sandbox"):
            unboxed[student] = record["no_sandbox"]
        devices.setdefault(record.get("device"), []).append(student)
    gradebook.export(the, grades)
    report = reports.class_report(the) if merged else None
    return {"merged": merged, "failed": failed, "missing": missing, "grades": grades, "report": report,
            "no_sandbox": unboxed, "devices": devices}


def print_merge(outcome: dict, where: Course | Path, job: Path,
                again: str = "python -m autograder grade --backend slurm --rerun --submit") -> None:
    """The merge's summary: the class table, then what failed or is missing and how to rerun it."""
    from . import grade

    the = course.of(where)
    if outcome["grades"]:
        grade.print_summary(outcome["grades"], the)
    print(f"\nmerged {len(outcome['merged'])} task(s) into {course.shown(the.gradebook_path)}"
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
