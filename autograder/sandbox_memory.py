"""Memory: one cgroup per grader that every sandboxed command joins, its limit, kills and peak.

:func:`memory_cgroup` makes it once per grader (v2 where the machine has it, else v1's memory
controller), limited to :func:`memory_bytes` with no swap; :mod:`.sandbox`'s command joins it,
as root, before anything else, so the command and all it starts count against the limit.
:func:`group_path` places a grader's cgroup v2 groups (a submission's, the judge's workers')
below it where the machine is unified. :func:`memory_kills` and :class:`MemoryPeak` read what
the limit did, per notebook.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from pathlib import Path

from labsupport.grading import cgroups

from .sandbox_users import user

MEMORY_SHARE = 0.75  # of the machine's memory, times the share of its cores this grader may use


def memory_bytes() -> int:
    """The memory limit of one sandbox: MEMORY_SHARE of the machine's, times this grader's share
    of the cores (``--jobs`` and Slurm pin each grader to its own cores, so graders sharing a
    node split its memory as they split its cores)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    share = len(os.sched_getaffinity(0)) / (os.cpu_count() or 1)
    return int(total * MEMORY_SHARE * min(1.0, share))


CGROUP_ROOT = Path("/sys/fs/cgroup")


@functools.cache
def memory_cgroup() -> tuple[Path | None, str | None]:
    """``(cgroup.procs of this grader's memory cgroup, None)``, or ``(None, why there is none)``.

    One cgroup per sandbox user (so per grader), limited to :func:`memory_bytes` with no swap,
    made once and joined by every command of that grader's sandboxes: cgroup v2 where the
    machine has it (``memory.max``), else v1's memory controller (``memory.limit_in_bytes``).
    """
    if sys.platform != "linux" or os.geteuid() != 0:
        return None, "memory cgroups need Linux and root"
    limit, name = memory_bytes(), f"lab-sandbox-{user()}"
    try:
        if (CGROUP_ROOT / "cgroup.controllers").is_file():  # v2, unified
            if "memory" not in (CGROUP_ROOT / "cgroup.subtree_control").read_text().split():
                (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory")
            group = CGROUP_ROOT / name
            group.mkdir(exist_ok=True)
            (group / "memory.max").write_text(str(limit))
            if (group / "memory.swap.max").exists():
                (group / "memory.swap.max").write_text("0")
        elif (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").is_file():  # v1
            group = CGROUP_ROOT / "memory" / name
            group.mkdir(exist_ok=True)
            swap = group / "memory.memsw.limit_in_bytes"  # memory and swap: never below memory alone
            if swap.exists():
                with contextlib.suppress(OSError):  # raising both: swap first; lowering: memory first
                    swap.write_text(str(limit))
            (group / "memory.limit_in_bytes").write_text(str(limit))
            if swap.exists():
                swap.write_text(str(limit))
        else:
            return None, f"no memory cgroup controller under {CGROUP_ROOT}"
    except OSError as err:
        return None, f"could not make a memory cgroup under {CGROUP_ROOT} ({err.strerror})"
    return group / "cgroup.procs", None


def group_path(name: str) -> Path:
    """Where this grader's cgroup v2 group ``name`` lies (:mod:`labsupport.grading.cgroups`; make it
    with ``Group.make``): below this grader's memory cgroup where the machine is unified, so its
    processes still count against the memory limit; else in the v2 hierarchy beside v1's."""
    procs, _ = memory_cgroup()
    if procs is not None and cgroups.unified():
        return procs.parent / name
    where = cgroups.mount()
    if where is None:
        raise cgroups.CgroupError(cgroups.problem() or "no cgroup v2 hierarchy")
    return where / f"lab-sandbox-{user()}" / name


def memory_kills() -> int:
    """How many processes the memory limit has killed in this grader's cgroup so far."""
    procs, _ = memory_cgroup()
    if procs is None:
        return 0
    for name in ("memory.events", "memory.oom_control"):  # v2, v1
        try:
            for line in (procs.parent / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            continue
    return 0


class MemoryPeak:
    """The peak memory of this grader's sandboxes from now (one notebook: its kernel, then its
    verdict process or judge's workers) until :meth:`read`. The memory cgroup's own high-water
    mark, reset here: v1's ``memory.max_usage_in_bytes`` (reset by writing 0), v2's ``memory.peak``
    (reset for the file descriptor that writes to it, Linux 6.12; before that, since the cgroup was
    made). It counts what the kernel charges the sandboxes: their processes' memory, and the pages
    of their tmpfs folders.
    """

    def __init__(self):
        self._handle = None
        procs, _ = memory_cgroup()
        if procs is None:
            return
        for name, reset in (("memory.peak", "reset"), ("memory.max_usage_in_bytes", "0")):
            try:
                self._handle = open(procs.parent / name, "r+")
            except OSError:
                continue
            with contextlib.suppress(OSError):
                self._handle.write(reset)
                self._handle.flush()
            return

    def read(self) -> int | None:
        """The peak in bytes since this was made (None where there is no memory cgroup); closes it."""
        if self._handle is None:
            return None
        try:
            self._handle.seek(0)
            return int(self._handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        finally:
            self._handle.close()
            self._handle = None
