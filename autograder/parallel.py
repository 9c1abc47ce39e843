"""Grade several submissions at once on one machine: ``python -m autograder grade --jobs N``.

A grading machine with many cores (or several GPUs) and no Slurm grades one submission at a time
by default. With ``--jobs N`` it grades N at once, each exactly as a Slurm array task does
(:func:`tasks.run_task`): in a private copy of the course, with its own sandbox user, gradebook
and compile caches. Each runs in its own process pinned to its own share of the cores (and its
own GPU, where there are GPUs), so no two submissions are timed on the same core or GPU. The
tasks are then merged into the course as Slurm's are (:func:`tasks.merge`).

Speed bars come from ``calibration.toml``, which applies only on as many cores as it was measured
on. With ``--jobs`` each submission runs on fewer, so calibrate on one share:
``taskset -c 0-7 python -m autograder calibrate`` for 8 cores a submission (otherwise the class
defaults apply).
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from . import course, stopping, tasks

JOB_DIR = "parallel"  # in the course root: students.txt, tasks/<student>/, logs/<student>.log
# A task sent SIGTERM ends its sandboxes and writes its record within seconds (a kernel killed by
# its cgroup, the gradebook written); past this it is killed.
STOP_WAIT_S = 60


@dataclass(frozen=True)
class Slot:
    """Where one submission is graded: its cores, and its GPU (CUDA_VISIBLE_DEVICES) if any."""

    cores: tuple[int, ...]
    gpu: str | None


def slots(jobs: int, cores: list[int], gpus: list[str]) -> list[Slot]:
    """Split ``cores`` (and ``gpus``) into ``jobs`` disjoint slots of equal size.

    Refuses more jobs than cores, or than GPUs where there are GPUs: two submissions timed on
    one core or one GPU would each measure the other's load.
    """
    if jobs < 1:
        raise course.CourseError(f"--jobs {jobs}: grade at least one submission at a time.")
    if jobs > len(cores):
        raise course.CourseError(f"--jobs {jobs} needs a core per submission, and this process may use "
                                 f"{len(cores)}: use --jobs {len(cores)} or fewer.")
    if gpus and jobs > len(gpus):
        raise course.CourseError(f"--jobs {jobs} needs a GPU per submission, and {len(gpus)} are visible "
                                 f"({', '.join(gpus)}): use --jobs {len(gpus)} or fewer.")
    share = len(cores) // jobs
    return [Slot(tuple(cores[i * share:(i + 1) * share]), gpus[i] if gpus else None) for i in range(jobs)]


def visible_gpus() -> list[str]:
    """The CUDA devices this process may hand out, as CUDA_VISIBLE_DEVICES names them."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [n.strip() for n in listed.split(",") if n.strip()] if listed else [str(i) for i in range(count)]
    return names[:count]


def job_dir(where: course.Course | Path) -> Path:
    return course.of(where).root / JOB_DIR


def start(where: course.Course | Path, students: list[str] | None, jobs: int, *, timeout_s: int | None = None,
          progress: bool = True) -> Future[Path]:
    """Start grading ``students`` (default: all collected) ``jobs`` at a time, in the background.

    Returns a Future of the job folder, done when every task has ended; :func:`grade` then merges
    it (:func:`tasks.merge`). Its ``stop()`` starts no further task and sends SIGTERM to those
    running (each ends its own sandboxes, :mod:`.stopping`), waiting for them (STOP_WAIT_S, then
    SIGKILL). The tasks start from this process's environment as it is now, so a
    serial batch graded here meanwhile (which sets its own variables while it runs) reaches none
    of them. Merge only once nothing else is grading into the course.
    """
    from tqdm.auto import tqdm

    from . import grade as serial

    the = course.of(where)
    students = serial.students_to_grade(the, students)
    if not hasattr(os, "sched_getaffinity"):
        raise course.CourseError(f"--jobs pins each submission to its own cores, which needs Linux (this is "
                                 f"{sys.platform}): grade one at a time, or on a Linux machine.")
    shares = slots(jobs, sorted(os.sched_getaffinity(0)), visible_gpus())
    free: queue.Queue[Slot] = queue.Queue()
    for slot in shares:
        free.put(slot)
    job = job_dir(the)
    shutil.rmtree(job, ignore_errors=True)
    (job / "logs").mkdir(parents=True)
    tasks.write_students(job, students)
    environ = dict(os.environ)
    print(f"grading {len(students)} submission(s), {jobs} at a time, {len(shares[0].cores)} core(s) each"
          + (", a GPU each" if shares[0].gpu else "") + f"; logs in {course.shown(job)}/logs/")

    running: dict[str, subprocess.Popen] = {}
    lock, stopped = threading.Lock(), threading.Event()

    def task(student: str) -> str:
        slot = free.get()
        try:
            command = [sys.executable, "-m", "autograder", "--course", str(the.root), "grade-task",
                       f"--job={job}", f"--cores={','.join(map(str, slot.cores))}", student]
            command += [f"--timeout={timeout_s}"] if timeout_s else []
            env = dict(environ, **({"CUDA_VISIBLE_DEVICES": slot.gpu} if slot.gpu else {}))
            with open(job / "logs" / f"{student}.log", "w") as log:
                with lock:
                    if stopped.is_set():
                        return student
                    running[student] = proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                               cwd=course.REPO_ROOT)
                try:
                    proc.wait()
                finally:
                    with lock:
                        running.pop(student, None)
            return student
        finally:
            free.put(slot)

    def stop() -> None:
        with lock:
            stopped.set()
            procs = list(running.values())
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def run_all() -> Path:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            done = as_completed([pool.submit(task, s) for s in students])
            for future in tqdm(done, total=len(students), desc="grading", unit="student", disable=not progress):
                future.result()
        return job

    runner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grade-jobs")
    try:
        future = runner.submit(run_all)
        future.stop = stop
        return future
    finally:
        runner.shutdown(wait=False)  # the submitted run goes on; the thread ends with it


def grade(where: course.Course | Path, students: list[str] | None, jobs: int, *, timeout_s: int | None = None,
          progress: bool = True) -> dict:
    """Grade ``students`` (default: all collected) ``jobs`` at a time, then merge them into the course.

    Returns :func:`tasks.merge`'s outcome; its ``grades`` are one NotebookGrade per notebook, as
    :func:`grade.grade` returns, and a task that failed is a "failed to grade" row.
    """
    with stopping.on_signals():
        running = start(where, students, jobs, timeout_s=timeout_s, progress=progress)
        try:
            job = running.result()
        except stopping.Stopped:  # nothing merged: `grade --jobs` grades them again
            running.stop()
            raise
    return tasks.merge(where, job)
