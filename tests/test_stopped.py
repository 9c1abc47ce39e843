"""A grading batch stopped as an instructor (Ctrl-C) or a scheduler (SIGTERM) stops it ends every
process and mount it started, records no mark the grader did not decide, and the next ``grade``
finishes the batch (autograder/stopping.py).

Two submissions of 01 only, at the tiny profile: ``blank`` (the release as handed out: no answer
written, so every check fails once judged; under ``grade`` its kernel's checks say "n/a, decided
by the grader", which nbgrader alone would count as 10/10) and ``reference``. ``grade`` runs as the
instructor runs it, ``python -m autograder grade``, in a process of its own.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

import scenarios
from autograder import course, kernel, release, sandbox, sandbox_memory, sandbox_users

pytestmark = pytest.mark.skipif(sandbox.problem() is not None, reason=f"no sandbox here: {sandbox.problem()}")

CHECKOUT = Path(__file__).resolve().parents[1]
NOTEBOOK = "01_profile"
FULL = 10.0  # 01's points (test_instructor.POINTS)
SEEN_WITHIN_S = 600  # for the kernel or the judge to start, on two loaded cores
SETTLE_S = 10  # the bar: nothing of the batch left this long after it was stopped


@pytest.fixture
def two_submissions(tmp_path, tiny_data):
    """A course with the release, ``blank``'s and ``reference``'s 01, and the environment to grade it.

    Its root lies deep enough that a submission's run folder passes a Unix socket's 107 bytes, as
    an instructor's course root may, and as make test's temporary folders did (pytest-xdist's
    ``popen-gwN``): a kernel that bound its channels there could not start, and every resumed
    notebook "failed to run" at once (kernel.SOCKETS)."""
    root = tmp_path / "an-instructor-s-course-folder" / "course"
    root.mkdir(parents=True)
    assert len(str(root / "sandbox" / "students" / "blank" / "run" / "kernel-1")) > kernel.IPC_PATH_MAX
    shutil.copyfile(course.COURSE_ROOT / course.CONFIG_NAME, root / course.CONFIG_NAME)
    shutil.copytree(course.source_dir(), root / "source", ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    released = release.generate(root)
    the = course.of(root)
    for student, scenario in (("blank", "unchanged"), ("reference", "reference")):
        folder = the.submitted(student)
        scenarios.write(scenario, released, root / "source" / "lab", folder)
        for path in folder.glob("*.ipynb"):
            if path.stem != NOTEBOOK:
                path.unlink()
    env = dict(os.environ, LAB_DATA=str(tiny_data), LAB_PROFILE="tiny", PYTHONPATH=str(CHECKOUT),
               LAB_CALIBRATION=str(tmp_path / "no-calibration.toml"))
    return root, env


def _grade(root: Path, env: dict) -> subprocess.Popen:
    """``grade`` of the course, its output into a file of its own, ``grade-<n>.log`` beside the
    course (a process it left behind holding a pipe would keep the test waiting for its end)."""
    n = len(list(root.parent.glob("grade-*.log"))) + 1
    log = open(root.parent / f"grade-{n}.log", "w")
    grader = subprocess.Popen([sys.executable, "-m", "autograder", "--course", str(root), "grade"], env=env,
                              cwd=CHECKOUT, stdout=log, stderr=subprocess.STDOUT)
    grader.log = Path(log.name)
    log.close()
    return grader


def _ended(grader: subprocess.Popen, root: Path, timeout_s: float) -> str:
    grader.wait(timeout=timeout_s)
    return grader.log.read_text(errors="replace")


def _below(grader: psutil.Process, wanted) -> psutil.Process | None:
    try:
        return next((p for p in grader.children(recursive=True) if wanted(p)), None)
    except psutil.Error:
        return None


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _stop_when(grader: subprocess.Popen, root: Path, wanted, signum: int) -> str:
    """Send ``signum`` to ``grader`` once a process ``wanted`` runs below it; its output once it ended."""
    me = psutil.Process(grader.pid)
    deadline = time.monotonic() + SEEN_WITHIN_S
    while _below(me, wanted) is None:
        assert grader.poll() is None, "grade ended before it was stopped"
        assert time.monotonic() < deadline, "the process to stop grade at never started"
        time.sleep(0.2)
    time.sleep(0.5)  # inside it
    grader.send_signal(signum)
    return _ended(grader, root, 180)


def _left_behind(root: Path) -> list[str]:
    """Processes that belong to this course's batch (their command line names the course, or a
    folder of it is mounted in their namespace: bwrap, timeout, the judge, the kernels, the
    workers), and mounts below the course."""
    found, ours = [], os.readlink("/proc/self/ns/mnt")
    for p in psutil.process_iter():
        try:
            line = _cmdline(p)
            sandboxed = os.readlink(f"/proc/{p.pid}/ns/mnt") != ours
            if str(root) in line or (sandboxed and str(root) in Path(f"/proc/{p.pid}/mountinfo").read_text()):
                found.append(f"{p.pid} {p.username()} {p.status()} {line[:160]}")
        except (psutil.Error, OSError):
            continue
    found += [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(root) in line]
    return found


def _scores(root: Path) -> dict[str, float]:
    """01's score per student in grades.csv and in the gradebook (they must agree)."""
    csv = pd.read_csv(root / "grades.csv")
    from_csv = {s: float(csv.loc[csv.student_id == s, "score"].sum()) for s in csv.student_id}
    with course.of(root).gradebook() as gb:
        from_book = {sub.student.id: float(sum(nb.score for nb in sub.notebooks if nb.name == NOTEBOOK))
                     for sub in gb.find_assignment("lab").submissions}
    assert from_csv == from_book, (from_csv, from_book)
    return from_book


def test_a_stopped_grade_ends_everything_and_records_only_what_the_judge_decided(two_submissions):
    root, env = two_submissions
    # 1. Ctrl-C while blank's 01 is judged: its kernel has run (and said n/a to every check).
    grader = _grade(root, env)
    out = _stop_when(grader, root, lambda p: "labsupport.grading.judging" in _cmdline(p), signal.SIGINT)
    time.sleep(SETTLE_S)
    assert _left_behind(root) == [], out[-3000:]
    assert grader.returncode != 0, out[-3000:]
    assert _scores(root).get("blank", 0.0) == 0.0, f"a mark the judge did not decide was recorded:\n{out[-3000:]}"
    summary = pd.read_csv(root / "grading_summary.csv", keep_default_na=False)
    assert summary.interrupted.astype(str).eq("True").all(), summary
    first = summary.loc[summary.notebook == NOTEBOOK].set_index("student")
    assert first.status.to_dict() == {"blank": "not graded"} and first.score.to_dict() == {"blank": 0.0}, summary
    assert list(summary.loc[summary.student == "reference", "status"]) == ["not graded"], summary
    assert "INTERRUPTED" in out

    # 2. SIGTERM (Slurm's, timeout's) while a kernel runs: once, grade died there and left it.
    grader = _grade(root, env)
    out = _stop_when(grader, root, lambda p: "ipykernel_launcher" in _cmdline(p), signal.SIGTERM)
    time.sleep(SETTLE_S)
    assert _left_behind(root) == [], out[-3000:]
    assert grader.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert _scores(root).get("blank", 0.0) == 0.0
    summary = pd.read_csv(root / "grading_summary.csv", keep_default_na=False)
    assert summary.interrupted.astype(str).eq("True").all() and "not graded" in set(summary.status), summary

    # 3. Run again: it finishes the batch, and every CSV says the same.
    grader = _grade(root, env)
    out = _ended(grader, root, 1800)
    assert grader.returncode == 0, out[-3000:]
    assert _left_behind(root) == []
    summary = pd.read_csv(root / "grading_summary.csv", keep_default_na=False)
    kept = "".join(f"\n--- {p} ---\n" + p.read_text(errors="replace")[-3000:]
                   for p in sorted((root / "grading_logs").rglob("*.autograde.log")))  # why a notebook failed to run
    assert _scores(root) == {"blank": 0.0, "reference": FULL}, \
        summary[["student", "notebook", "status", "errors"]].to_string() + "\n" + out[-3000:] + kept
    assert set(summary.status) == {"graded", "missing"} and not summary.interrupted.astype(str).eq("True").any(), summary
    first = summary.loc[summary.notebook == NOTEBOOK].set_index("student")
    assert first.status.to_dict() == {"blank": "graded", "reference": "graded"}, summary
    assert first.score.to_dict() == {"blank": 0.0, "reference": FULL}, summary
    assert (first.peak_bytes.astype(float) > 0).all(), summary  # each notebook's peak memory, shown
    assert "peak memory" in out
    by_check = pd.read_csv(root / "grades_by_check.csv", keep_default_na=False)
    by_check = by_check.loc[by_check.notebook == NOTEBOOK]
    assert set(by_check.loc[by_check.student == "reference", "result"]) <= {"pass", "n/a"}, by_check
    assert set(by_check.loc[by_check.student == "blank", "result"]) == {"fail"}, by_check
    assert by_check.groupby("student").score.sum().to_dict() == {"blank": 0.0, "reference": FULL}


def test_a_sandbox_ended_leaves_no_zombie_with_the_grader():
    """A sandbox's outer bwrap that ends before its init (pid 1 of its namespace) leaves that init
    to the grader, the subreaper: once, a ``[bwrap] <defunct>`` stayed with the grader for each
    (3-4 per notebook) until it exited. Now kill_all reaps them."""
    from labsupport.grading import cgroups

    if cgroups.problem():
        pytest.skip(cgroups.problem())
    group = cgroups.Group.make(sandbox_memory.group_path("zombie-test"))
    box = sandbox.Sandbox(writable=(), readable=(), budget_s=120, group=group.path)
    proc = subprocess.Popen(box.command([sys.executable, "-c", "import subprocess, time; "
                                         "subprocess.Popen(['sleep', '100']); time.sleep(100)"]))
    try:
        deadline = time.monotonic() + 60
        while not any(_real_uid(p) == sandbox_users.user() for p in psutil.Process().children(recursive=True)):
            assert time.monotonic() < deadline, "the sandboxed process never started"
            time.sleep(0.1)
        assert group.kill()  # the whole sandbox, at once: as a stopped grade ends a submission
        proc.wait(timeout=30)
        sandbox_users.kill_all()
        # The sandbox's own (bwrap's): the grader is a subreaper, so other tests' orphans (a headless
        # chromium's crash handlers) can be left to this process too, and are not the sandbox's.
        zombies = [f"{p.pid} {p.name()}" for p in psutil.Process().children(recursive=True)
                   if p.status() == psutil.STATUS_ZOMBIE and p.name() == "bwrap"]
        assert zombies == [], zombies
    finally:
        proc.kill()
        proc.wait()
        group.remove()


def _real_uid(p: psutil.Process) -> int | None:
    try:
        return p.uids().real
    except psutil.Error:
        return None


def test_a_notebook_that_fails_to_run_keeps_its_whole_log_where_the_summary_says(tmp_path):
    """nbgrader logs the error of a notebook it could not run (a kernel that never started) before
    its last words ("Please see the above traceback"): the summary's line says that error and
    names a file that keeps the whole log, with the sandboxed kernel's own output; a later
    success removes it."""
    import logging
    import types

    from traitlets.config import Config

    from autograder import gradebook

    run = tmp_path / "run"
    run.mkdir()
    (run / kernel.LOG).write_text("zmq.error.ZMQError: ipc path is longer than 107 characters\n")

    class Autograde:
        fails = True

        def __init__(self):
            self.log = logging.getLogger("test-autograde")
            self.coursedir = types.SimpleNamespace(root=str(tmp_path / "course"), student_id="alice",
                                                   notebook_id=NOTEBOOK)
            self.config = Config()
            for key, value in kernel.settings(run, tmp_path / "connection").items():
                section, name = key.split("__")
                self.config[section][name] = value

        def start(self):
            if not self.fails:
                return
            try:
                raise RuntimeError("the kernel exited (code 1) before it opened its channels")
            except RuntimeError:
                import traceback

                self.log.error("There was an error processing assignment: lab")
                self.log.error(traceback.format_exc())
            self.log.error("Please see the the above traceback for details on the specific errors")
            raise ValueError("Please see the the above traceback for details on the specific errors")

    outcome = gradebook.run(Autograde())
    line = gradebook.last_error_line(outcome)
    kept = tmp_path / "course" / gradebook.LOGS / "alice" / f"{NOTEBOOK}.autograde.log"
    assert "RuntimeError: the kernel exited (code 1)" in line and str(kept.relative_to(tmp_path / "course")) in line, line
    assert "above traceback" not in line, line
    text = kept.read_text()
    assert "Traceback (most recent call last)" in text and "ZMQError: ipc path is longer" in text, text
    Autograde.fails = False
    assert gradebook.run(Autograde())["success"] and not kept.exists() and not kept.parent.exists()
