"""The grading sandbox (autograder/sandbox.py), one property at a time, with small commands.

The hostile submissions themselves are graded in test_instructor.py; these show each wall on
its own, in a second or two each. They need root and bubblewrap (``make test`` installs it).
"""

from __future__ import annotations

import fcntl
import subprocess
import sys

import pytest

from autograder import sandbox, sandbox_disk, sandbox_users

pytestmark = pytest.mark.skipif(sandbox.problem() is not None,
                                reason=f"no grading sandbox here: {sandbox.problem()}")


def run(box: sandbox.Sandbox, code: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(box.command([sys.executable, "-c", code], **kwargs), capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def folders(tmp_path):
    writable, readable, hidden = tmp_path / "w", tmp_path / "r", tmp_path / "hidden"
    for folder in (writable, readable, hidden):
        folder.mkdir()
    (readable / "data.txt").write_text("data")
    (hidden / "answers.txt").write_text("secret")
    sandbox_users.own(writable)
    return writable, readable, hidden


def test_it_sees_only_what_it_is_given(folders):
    writable, readable, hidden = folders
    box = sandbox.Sandbox(writable=(writable,), readable=(readable,))
    done = run(box, f"""
import os, pathlib
print(os.getuid())
print(pathlib.Path({str(readable / 'data.txt')!r}).read_text())
pathlib.Path({str(writable / 'out.txt')!r}).write_text("written")
for path in ({str(hidden / 'answers.txt')!r}, "/work", "/root/.ssh"):
    print(path, os.path.exists(path))
try:
    pathlib.Path({str(readable / 'x')!r}).write_text("x")
except OSError as err:
    print("read-only:", err.errno)
""")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == str(sandbox_users.user()) and lines[1] == "data"
    assert f"{hidden / 'answers.txt'} False" in lines and "/root/.ssh False" in lines
    assert "read-only: 30" in lines  # EROFS
    assert (writable / "out.txt").read_text() == "written"


def test_no_network():
    done = run(sandbox.Sandbox((), ()), """
import socket
try:
    socket.create_connection(("pypi.org", 443), timeout=5)
    print("connected")
except OSError as err:
    print("no network:", type(err).__name__)
""")
    assert "no network" in done.stdout, done.stdout + done.stderr


def test_processes_are_bounded_and_end_with_it():
    before = subprocess.run(["pgrep", "-u", str(sandbox_users.user())], capture_output=True, text=True).stdout
    assert not before.strip(), f"processes of the sandbox user before the test: {before}"
    done = run(sandbox.Sandbox((), ()), """
import os, subprocess, time
subprocess.Popen(["sleep", "300"], start_new_session=True)  # meant to outlive the sandbox
children = []
try:
    while len(children) < 5000:
        pid = os.fork()
        if pid == 0:
            time.sleep(300)
            os._exit(0)
        children.append(pid)
except OSError as err:
    print("stopped at", len(children))
""")
    count = int(done.stdout.split()[-1])
    assert count < sandbox.MAX_PROCESSES, done.stdout
    left = subprocess.run(["pgrep", "-u", str(sandbox_users.user())], capture_output=True, text=True).stdout
    assert not left.strip(), f"processes outlived the sandbox: {left}"


def test_wall_clock_budget():
    done = subprocess.run(sandbox.Sandbox((), (), budget_s=2).command(["sleep", "60"]), capture_output=True,
                          timeout=60)
    assert done.returncode == 124  # timeout's "timed out"


def test_file_size_and_tmp_are_bounded(folders, monkeypatch):
    writable, _, _ = folders
    monkeypatch.setattr(sandbox, "MAX_FILE_BYTES", 2**20)
    monkeypatch.setattr(sandbox, "TMP_BYTES", 4 * 2**20)
    done = run(sandbox.Sandbox((writable,), ()), f"""
import errno
for path in ({str(writable / 'big.bin')!r}, "/tmp/big.bin"):
    try:
        with open(path, "wb") as f:
            f.write(bytes(8 * 2**20))
        print(path, "written")
    except OSError as err:
        print(path, errno.errorcode[err.errno])
""")
    assert f"{writable / 'big.bin'} EFBIG" in done.stdout, done.stdout + done.stderr
    assert "/tmp/big.bin" in done.stdout and "/tmp/big.bin written" not in done.stdout


def test_the_watchdog_stops_a_disk_fill(folders, monkeypatch):
    writable, _, _ = folders
    monkeypatch.setattr(sandbox_disk, "STORE_BYTES", 8 * 2**20)
    code = f"""
import time
for i in range(1000):
    with open({str(writable)!r} + f"/fill-{{i}}.bin", "wb") as f:
        f.write(bytes(2**20))
    time.sleep(0.01)
"""
    with sandbox_disk.watchdog((writable,), every_s=0.2) as dog:
        run(sandbox.Sandbox((writable,), ()), code)
    assert dog.tripped
    assert sandbox_disk.folder_bytes(writable) < 200 * 2**20


def test_graders_sharing_a_node_run_students_as_different_users():
    """Two Slurm tasks on one node (a GPU each) grade at once: each claims its own sandbox user,
    so one submission's fork storm cannot spend the other's process count. The claim is a lock
    held for the grader's life: another grader gets the next id, and the id is free again after."""
    claim = [sys.executable, "-c", "from autograder import sandbox_users; print(sandbox_users.user())"]
    mine = sandbox_users.user()
    other = int(subprocess.run(claim, capture_output=True, text=True, check=True).stdout)
    # (nobody, or a spare id: a grader beside this one, the instructor tests', may hold a lower one meanwhile)
    assert other != mine and other in (sandbox_users.NOBODY, *sandbox_users.SPARE_USERS)
    holder = subprocess.Popen([sys.executable, "-c", "from autograder import sandbox_users; import time; "
                               "print(sandbox_users.user(), flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        held = int(holder.stdout.readline())
        third = int(subprocess.run(claim, capture_output=True, text=True, check=True).stdout)
        assert len({mine, held, third}) == 3
    finally:
        holder.kill()
        holder.wait()
    # Free again: its lock can be taken now. (Not "the next claim gets it": another grader on this
    # machine, a test worker beside this one, may claim a lower id first.)
    with open(sandbox_users.USER_LOCKS / f"lab-sandbox-user-{held}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_kill_all_ends_this_graders_processes_and_no_one_elses():
    """kill_all after a notebook ends what that notebook started, however deep, orphans included
    (a sandbox whose outer process was killed first leaves its processes to the grader, its
    reaper), and reaps them, so that none keeps a slot of the user's process limit. Nothing of a
    neighbouring grader's that runs as the same user is touched."""
    uid = str(sandbox_users.user())
    as_user = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    neighbour = subprocess.Popen([*as_user, "sleep", "301"])  # another grader's
    grader = f"""
import subprocess, time
from autograder import sandbox_users
sandbox_users.user()  # this process becomes the reaper of its orphans
sandbox_users.user = lambda: {uid}  # ... and shares the neighbour's user, as if both held it
subprocess.Popen({as_user!r} + ["sh", "-c", "sleep 300 & sleep 300"])  # a child, and a grandchild
subprocess.run({as_user!r} + ["sh", "-c", "sleep 300 &"])  # an orphan, left to this process
time.sleep(0.5)
sandbox_users.kill_all()
print(subprocess.run(["pgrep", "-u", "{uid}", "-x", "-a", "sleep"], capture_output=True, text=True).stdout)
"""
    try:
        done = subprocess.run([sys.executable, "-c", grader], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        left = [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.strip()]
        assert left == ["sleep 301"], done.stdout  # neither a zombie nor a live one of its own
        assert neighbour.poll() is None
    finally:
        neighbour.kill()
        neighbour.wait()


def test_the_gpu_driver_is_bound_wherever_it_lives():
    """The driver's libraries outside the folders every sandbox sees are found from what this
    process loaded (the CUDA branch itself runs only on a GPU machine)."""
    maps = ("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159\n"
            "7f02-7f03 r-xp 0 08:01 2 /cm/local/apps/cuda-driver/libs/580/lib64/libnvidia-ml.so.1\n"
            "7f04-7f05 r-xp 0 08:01 3 /opt/nvidia/lib/libcuda.so.1\n"
            "7f06-7f07 rw-p 0 00:00 0 [heap]\n")
    assert sandbox.driver_folders(maps) == [sandbox.Path("/cm/local/apps/cuda-driver/libs/580/lib64")]
    assert sandbox.gpu_problem(sandbox.Sandbox(writable=(), readable=())) is None  # no GPU here: nothing to check


def test_a_sandbox_gets_only_its_own_gpus_device_file(tmp_path):
    """Under --jobs or Slurm a grader sees one GPU (CUDA_VISIBLE_DEVICES); its sandbox gets that
    GPU's /dev/nvidiaN and the driver's shared files, never another slot's GPU, so student code
    that resets CUDA_VISIBLE_DEVICES reaches no other GPU. A fake driver list and /dev tree."""
    dev, gpus = tmp_path / "dev", tmp_path / "gpus"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
                 "nvidia-modeset", "null"):
        (dev / name).touch()
    (dev / "nvidia-caps").mkdir()
    # The driver numbers its device files by minor, not in CUDA's order: bus 3b is minor 2.
    for bus, uuid, minor in (("0000:1a:00.0", "GPU-aaaa", 0), ("0000:2b:00.0", "GPU-bbbb", 1),
                             ("0000:3b:00.0", "GPU-cccc", 2), ("0000:4c:00.0", "GPU-dddd", 3)):
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text(
            f"Model: \t NVIDIA H100 80GB HBM3\nIRQ: \t 1\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\n"
            f"Device Minor: \t {minor}\nGPU Excluded: \t No\n")
    shared = ["nvidia-caps", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]
    names = lambda uuids: [p.name for p in sandbox.gpu_device_files(uuids, gpus, dev)]  # noqa: E731
    assert names(["GPU-cccc"]) == sorted(shared + ["nvidia2"])
    assert names(["GPU-dddd", "GPU-aaaa"]) == sorted(shared + ["nvidia0", "nvidia3"])
    every = sorted(shared + ["nvidia0", "nvidia1", "nvidia2", "nvidia3"])
    assert names(None) == every  # torch could not say which: every GPU, and the probe checks the sandbox
    assert names(["MIG-1234"]) == every  # not in the driver's list
