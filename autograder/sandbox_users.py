"""The sandbox user each grader claims, and the end of every process it started as that user.

A sandboxed command runs as an unprivileged user (:mod:`.sandbox` drops to it with ``setpriv``).
Where graders share a node (a Slurm task per GPU, slurm.py and tasks.py; ``grade --jobs``,
parallel.py), each claims its own (:func:`user`): ``nobody`` for the first, then the unassigned
ids from 65000 up. So one submission's fork storm spends its own process count, not its
neighbour's, and a grader kills only the processes it started itself (:func:`kill_all`), by
cgroup where it has one (:func:`track`), then by a walk of /proc; :func:`reap` collects the
sandboxes' zombies left to this grader, its child subreaper.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from labsupport.grading import cgroups
from labsupport.grading.cgroups import Group

NOBODY = 65534  # the unprivileged user the sandboxed processes run as (the first grader's)
# Further graders on the same machine: ids Debian reserves and never assigns (65000-65533), so no
# real user's processes or files are ever theirs. A grader holds its id by a lock file.
SPARE_USERS = range(65000, 65534)
PR_SET_CHILD_SUBREAPER = 36  # prctl option (linux/prctl.h)
USER_LOCKS = Path("/run/lock") if Path("/run/lock").is_dir() else Path(tempfile.gettempdir())


@functools.cache
def user() -> int:
    """This grading process's sandbox user: ``nobody``, or the first spare id no other grader on
    this machine holds. Held (by an exclusive lock on a file in USER_LOCKS) until the process
    exits, so two graders sharing a node never run students' code as the same user.

    Claiming it also makes this process the reaper of orphans below it (Linux's child
    subreaper): what a sandbox leaves behind stays where :func:`kill_all` looks.
    """
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for uid in (NOBODY, *SPARE_USERS):
        handle = open(USER_LOCKS / f"lab-sandbox-user-{uid}.lock", "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        _HELD.append(handle)  # the lock lasts as long as this process
        return uid
    raise RuntimeError(f"every sandbox user id is held by another grader on this machine ({USER_LOCKS})")


_HELD: list = []


def own(*paths: Path) -> None:
    """Give ``paths`` (folders, recursively) to the sandbox user, so it can write there.

    Only for what root itself just made or copied, before any sandboxed process could reach it:
    after one has run in a folder, root never walks, chowns or writes it by path again (the
    process could have put links there). Every link met is left alone, not followed.
    """
    uid = user()
    for path in paths:
        path.mkdir(parents=True, exist_ok=True)
        for root, dirs, files in os.walk(path):
            os.chown(root, uid, uid, follow_symlinks=False)
            for name in files:
                os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


def kill_all(wait_s: float = 10.0) -> None:
    """Kill every process of this grader's sandbox user that this grader started, however deep,
    and reap those left to it, so that none still counts against the user's process limit when
    the next notebook or verdict process starts.

    Not every process of the user: another grader on the node (or the system's own ``nobody``)
    is none of ours. A process the sandbox started stays below this one: it cannot leave the
    sandbox's PID namespace, and where a sandbox's own first process is killed first, its orphans
    come to this process (:func:`user` makes it their reaper), not to the machine's init.
    Repeated while it finds any, since a fork storm adds processes while they are killed.
    First, each group :func:`track` names (a submission's) is killed as a whole (``cgroup.kill``:
    its forks cannot escape it as they can a pid walk); last, the sandboxes' zombies are reaped
    (:func:`reap`).
    """
    me = os.getpid()
    deadline = time.monotonic() + wait_s
    for group in _GROUPS:  # by cgroup first: a group's forks cannot escape it, as they can a pid walk
        Group(group).kill(wait_s=min(wait_s, cgroups.WAIT_S))
    while True:
        table = _processes()
        found = ours(table)
        for pid in found:
            if table[pid][1] != "Z":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            elif table[pid][0] == me:  # a zombie left to us: reap it, or it keeps its slot
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
        if not found or time.monotonic() > deadline:
            reap()
            return
        time.sleep(0.05)


# The cgroup v2 groups of this grader's sandboxes (:func:`track`), which :func:`kill_all` ends as a whole.
_GROUPS: list[Path] = []


def track(group: Path) -> None:
    """Have :func:`kill_all` end every process of ``group`` (a submission's, :func:`.sandbox_memory.group_path`) too."""
    if Path(group) not in _GROUPS:
        _GROUPS.append(Path(group))


def untrack(group: Path) -> None:
    with contextlib.suppress(ValueError):
        _GROUPS.remove(Path(group))


def reap() -> int:
    """Reap the sandboxes' first processes left to this grader, and return how many.

    bwrap forks the sandbox's init (pid 1 of its own PID namespace, a session of its own); when
    the outer bwrap ends first (killed, or its ``timeout`` was), that init comes to this process
    (:func:`user` made it their subreaper) and, once ended, stays a zombie (``[bwrap] <defunct>``,
    3-4 per notebook) until the grader exits. Only zombies this process did not start are reaped:
    one that lived in another PID namespace, or a bwrap that is not its session's leader; a child
    the grader started (subprocess's, jupyter_client's) is in this namespace and leads its session,
    and is left to whoever waits for it.
    """
    me, reaped = os.getpid(), 0
    for pid, (ppid, state) in _processes().items():
        if ppid != me or state != "Z":
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            session = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[3])
        except (OSError, ValueError, IndexError):
            continue
        foreign = len(fields.get("NSpid", "").split()) > 1
        if foreign or (fields.get("Name", "").strip() == "bwrap" and session != pid):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
                reaped += 1
    return reaped


def ours(table: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """The processes below this grader (however deep) that run as its sandbox user, in ``table``
    (:func:`_processes`; read now where None)."""
    uid = user()
    return [pid for pid in _descendants(os.getpid(), _processes() if table is None else table) if _real_uid(pid) == uid]


def _processes() -> dict[int, tuple[int, str]]:
    """``{pid: (parent pid, state)}`` of every process, from /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    # pid (comm) state ppid ...: comm may hold spaces and parentheses
                    state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
                table[int(entry.name)] = (int(ppid), state)
            except (OSError, ValueError, IndexError):
                continue
    return table


def _descendants(root: int, table: dict[int, tuple[int, str]]) -> list[int]:
    """The processes below ``root`` (children, theirs, ...) in ``table``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _real_uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line for line in f if line.startswith("Uid:")).split()[1])
    except (OSError, StopIteration, ValueError):
        return None
