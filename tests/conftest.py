"""Shared fixtures: a tiny generated dataset and the tiny profile, so tests stay fast.

One intra-op thread per process, in this process and every process the tests start (kernels,
verdicts, graders inherit it): the suite runs several torch processes per core at once (the
instructor fixture's three graders, and pytest-xdist's workers beside them). With two OpenMP
threads each, their threads spin waiting for each other. Four ResNet-18 training loops at once on
two cores, two of them pinned to a core each: the two others took 89 s with two threads each, 18 s
with one. Set OMP_NUM_THREADS to run the tests with more.
"""

import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported, here or in any child

import psutil  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from labsupport import dataset  # noqa: E402
from labsupport.hardware import PROFILES  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # in case torch was imported before this file


# The order make test hands the test files to its two workers (pytest-xdist, --dist loadfile
# --no-loadscope-reorder: a file per worker at a time, the next file to whichever worker frees up
# first). The instructor tests first: their fixture grades the class, the long pole, on one worker.
# Beside them the two files of many tests (test_judge, about 580 s; test_checks, about 430 s), then
# the files of the longest single tests, then every other file, the largest first (its size standing
# in for its time: a new test file needs no entry here), so that the last files to start are short
# and both workers end together. With test_judge handed out after the others (ci6), one worker ran
# it alone for the last minutes while the other core idled a third of that time (vmstat); before
# that, xdist's own order (most tests first) had left the real-profile test to run last on one core
# while the other core idled for 113 s. (--dist loadgroup could spread test_judge a test at a time,
# but xdist 3.8 names a test's group in a field pytest 9.2 no longer reads: its groups do nothing.)
LONGEST_FIRST = ("test_instructor.py", "test_judge.py", "test_checks.py", "test_real_profile.py", "test_stopped.py",
                 "test_dataset.py", "test_train.py", "test_student.py", "test_grading.py", "test_distributed.py",
                 "test_unbatched.py")


def file_rank(path: Path) -> tuple[int, int]:
    """Where a test file runs in make test's order: LONGEST_FIRST's files in theirs, then the rest by size."""
    if path.name in LONGEST_FIRST:
        return LONGEST_FIRST.index(path.name), 0
    return len(LONGEST_FIRST), -path.stat().st_size


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: file_rank(item.path))  # stable: a file's own order kept


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A 10-class lab dataset with a few small images per class (not the real one)."""
    root = tmp_path_factory.mktemp("data") / "lab-shapes"
    return dataset.generate(root, seed=0, train_per_class=4, val_per_class=2, source_size=48,
                            progress=False)


@pytest.fixture
def tiny():
    return PROFILES["tiny"]


@pytest.fixture
def tiny_env(monkeypatch, tiny_data, tmp_path) -> Path:
    """This test's lab at the tiny profile: the tiny dataset, a results store of its own (returned)
    and no calibration (the class defaults). A test that needs another profile sets LAB_PROFILE
    after it (``tiny:grades_speed=1``)."""
    monkeypatch.setenv("LAB_DATA", str(tiny_data))
    monkeypatch.setenv("LAB_PROFILE", "tiny")
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("LAB_CALIBRATION", str(tmp_path / "no-calibration.toml"))
    return tmp_path / "results"


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="needs a CUDA GPU (run on a GPU machine to cover this)")


# --- the suite ends every process it started ------------------------------------------------------
# Kinds of process a test starts that must not outlive it (issue 62: make run kept every kernel).
# Each pytest process checks its own descendants when its session ends, after the session's
# fixtures: under pytest-xdist each worker its own, and the controller fails the session with what
# any of them left (a worker's exit status does not fail the session).
STARTED_BY_TESTS = ("ipykernel_launcher", "bwrap", "labsupport.grading.judging", "labsupport.grading.worker",
                    "labsupport.grading.verdict")
GRACE_S = 10  # a process killed by a test's last line may still be on its way out
_LEFT_BY_WORKERS: list[str] = []


def left_running(grace_s: float = GRACE_S) -> list[str]:
    """This process's descendants of STARTED_BY_TESTS still running after ``grace_s`` (zombies,
    already ended, aside), described; they are killed, so that the suite leaves none."""
    def running(processes):
        alive = []
        for process in processes:
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except psutil.Error:
                pass
        return alive

    started = []
    for process in psutil.Process().children(recursive=True):
        try:
            if any(kind in " ".join(process.cmdline()) for kind in STARTED_BY_TESTS):
                started.append(process)
        except psutil.Error:
            pass
    deadline = time.monotonic() + grace_s
    while (left := running(started)) and time.monotonic() < deadline:
        time.sleep(0.2)
    described = []
    for process in left:
        try:
            described.append(f"pid {process.pid} (parent {process.ppid()}): {' '.join(process.cmdline())[:200]}")
            process.kill()
        except psutil.Error:
            pass
    return described


@pytest.hookimpl(trylast=True)  # after the runner's, which tears the session's fixtures down
def pytest_sessionfinish(session):
    left = left_running()
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its controller reports it
        session.config.workeroutput["left_running"] = left
        return
    left += _LEFT_BY_WORKERS
    if left:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_sep("=", f"processes the tests started, still running at their end: {len(left)}", red=True)
        for line in left:
            reporter.write_line(line)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, on its controller
def pytest_testnodedown(node, error):
    _LEFT_BY_WORKERS.extend(getattr(node, "workeroutput", {}).get("left_running", []))
