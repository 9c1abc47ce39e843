"""A cgroup stops, measures and ends a set of processes as a whole, even processes that keep changing pid."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from labsupport.grading import cgroups

needs_cgroups = pytest.mark.skipif(cgroups.problem() is not None,
                                   reason=f"no cgroup v2 groups here: {cgroups.problem()}")

# A process that forks a CPU burner and exits every few milliseconds: its pid is never the one
# listed a moment ago (what SIGSTOP by a pid list from /proc could not stop: issue 60).
HOPPER = """
import os, time
while True:
    if os.fork():
        os._exit(0)
    end = time.monotonic() + 0.002
    while time.monotonic() < end:
        pass
"""


def test_mount_is_found_in_mountinfo():
    hybrid = "35 25 0:30 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n" \
             "36 25 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    assert cgroups.mount(hybrid) == cgroups.Path("/sys/fs/cgroup/unified")
    assert cgroups.mount("30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n") == cgroups.Path("/sys/fs/cgroup")
    assert cgroups.mount("36 25 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") is None


@needs_cgroups
def test_a_frozen_group_uses_no_cpu_even_while_its_processes_change_pid():
    group = cgroups.Group.make(cgroups.mount() / f"lab-test-{uuid.uuid4().hex[:8]}")
    try:
        subprocess.Popen(group.join_command() + [sys.executable, "-c", HOPPER], start_new_session=True)
        time.sleep(0.5)
        assert group.pids(), "the hopper is running in its group"
        ran = group.cpu_usec()
        time.sleep(0.5)
        # Running, it uses CPU: at least 10 ms in 0.5 s even on two cores busy with the rest of the suite
        # (it got 37 ms in 0.2 s beside a real-profile judge).
        assert group.cpu_usec() - ran > 10_000, "running, the hopper uses CPU"
        group.freeze()
        still, pids = group.cpu_usec(), set(group.pids())
        time.sleep(0.5)
        assert group.cpu_usec() - still < 1_000, "frozen, no process of the group ran"
        assert set(group.pids()) == pids, "frozen, it forked nothing"
        group.freeze(False)
        time.sleep(0.5)
        assert group.cpu_usec() - still > 10_000, "thawed, it runs again"
        assert group.kill(), "killed, the group is empty"
    finally:
        assert group.remove()
    assert not group.path.exists()
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _runs_hopper(p)]


def _runs_hopper(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"os.fork()" in f.read()
    except OSError:
        return False
