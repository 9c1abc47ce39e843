"""The grading sandbox (autograder/sandbox.py), one property at a time, with small commands.

The hostile submissions themselves are graded in test_instructor.py; these show each wall on
its own, in a second or two each. They need root and bubblewrap (``make test`` installs it).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from autograder import sandbox

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
    sandbox.own(writable)
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
    assert lines[0] == str(sandbox.NOBODY) and lines[1] == "data"
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
    before = subprocess.run(["pgrep", "-u", str(sandbox.NOBODY)], capture_output=True, text=True).stdout
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
    left = subprocess.run(["pgrep", "-u", str(sandbox.NOBODY)], capture_output=True, text=True).stdout
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
    monkeypatch.setattr(sandbox, "STORE_BYTES", 8 * 2**20)
    code = f"""
import time
for i in range(1000):
    with open({str(writable)!r} + f"/fill-{{i}}.bin", "wb") as f:
        f.write(bytes(2**20))
    time.sleep(0.01)
"""
    with sandbox.watchdog((writable,), every_s=0.2) as dog:
        run(sandbox.Sandbox((writable,), ()), code)
    assert dog.tripped
    assert sandbox.folder_bytes(writable) < 200 * 2**20
