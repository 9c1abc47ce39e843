"""cgroup v2 groups: a set of processes stopped, measured and ended as a whole, forks included.

The grader puts each side the judge times (the student's worker, the baseline's) and each
submission's sandboxes in a group of their own. A group is the kernel's way to act on a set of
processes that a pid list from ``/proc`` cannot pin down: a process that forks and lets its parent
exit every millisecond is never the pid that was listed, but it never leaves its cgroup (the
sandbox mounts no cgroup filesystem it could write). So:

- :meth:`Group.freeze` stops every process of the group at once, those it forks while freezing
  included, and returns when the kernel says the whole group is frozen (``frozen 1`` in
  ``cgroup.events``);
- :meth:`Group.cpu_usec` is the CPU time the group's processes used (``cpu.stat``'s
  ``usage_usec``): read before and after a block, it shows whether a frozen side really ran;
- :meth:`Group.kill` ends them all (``cgroup.kill``), and :meth:`Group.remove` the group.

The files are the kernel's own interface (Documentation/admin-guide/cgroup-v2.rst: "cgroup.freeze",
"cgroup.kill", "cpu.stat"); they exist in every non-root cgroup v2 group, whichever controllers are
enabled (Linux 5.2 for the freezer, 5.14 for ``cgroup.kill``: older kernels are killed pid by pid,
frozen, so none can fork meanwhile). Making groups needs root. Where it cannot be had,
:func:`problem` says why, and the caller decides what then is not done (the judge grades no speed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

WAIT_S = 5.0  # for a freeze or a kill to take effect: milliseconds normally, seconds under load


class CgroupError(RuntimeError):
    """A group could not be made, frozen or emptied: why, in one sentence."""


def mount(mountinfo: str | None = None) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` on a unified machine,
    ``/sys/fs/cgroup/unified`` on a hybrid one), or None where there is none."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    found = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            found.append(Path(left.split()[4].encode().decode("unicode_escape")))
    found.sort(key=lambda p: (p != Path("/sys/fs/cgroup"), len(str(p))))
    return found[0] if found else None


def unified() -> bool:
    """Whether cgroup v2 is the machine's only hierarchy (then its memory controller is v2's too)."""
    return mount() == Path("/sys/fs/cgroup")


def problem() -> str | None:
    """Why no group can be made here (None when one can)."""
    if not os.path.exists("/proc/self/mountinfo"):
        return "cgroups need Linux"
    if os.geteuid() != 0:
        return "making cgroups needs root"
    where = mount()
    if where is None:
        return "no cgroup v2 hierarchy is mounted (/sys/fs/cgroup or /sys/fs/cgroup/unified)"
    if not os.access(where, os.W_OK):
        return f"the cgroup v2 hierarchy at {where} is read-only here"
    return None


class Group:
    """One cgroup v2 group, by its folder (made by :meth:`make`)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def make(cls, path: Path) -> "Group":
        """The group at ``path`` (its parents made as needed); a CgroupError where it cannot be."""
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CgroupError(f"could not make cgroup {path} ({err.strerror})") from None
        group = cls(path)
        if not (group.path / "cgroup.freeze").exists():
            raise CgroupError(f"cgroup {path} has no cgroup.freeze (a cgroup v2 group on Linux 5.2+ has)")
        return group

    @property
    def procs(self) -> Path:
        """The file a process writes its pid into to join (``cgroup.procs``)."""
        return self.path / "cgroup.procs"

    def join_command(self) -> list[str]:
        """A command prefix that joins this group and then runs the rest of the command: what it
        starts is in the group from its first instruction (nothing can fork before it joined)."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.procs)]

    def _events(self) -> dict[str, str]:
        try:
            return dict(line.split(" ", 1) for line in (self.path / "cgroup.events").read_text().splitlines())
        except (OSError, ValueError):
            return {}

    def pids(self) -> list[int]:
        """Every process of the group and of the groups below it."""
        found = []
        for folder, _, _ in os.walk(self.path):
            with contextlib.suppress(OSError, ValueError):
                found += [int(p) for p in (Path(folder) / "cgroup.procs").read_text().split()]
        return found

    def freeze(self, frozen: bool = True, wait_s: float = WAIT_S) -> None:
        """Stop (or let run again) every process of the group; returns once the kernel reports it
        done, else a CgroupError (a process in uninterruptible sleep can hold a freeze up)."""
        (self.path / "cgroup.freeze").write_text("1" if frozen else "0")
        deadline = time.monotonic() + wait_s
        want = "1" if frozen else "0"
        while self._events().get("frozen", want) != want:
            if time.monotonic() > deadline:
                raise CgroupError(f"cgroup {self.path.name} did not {'freeze' if frozen else 'thaw'} "
                                  f"within {wait_s:.0f} s")
            time.sleep(0.0005)

    def cpu_usec(self) -> int:
        """Microseconds of CPU time the group's processes have used so far (``cpu.stat``)."""
        for line in (self.path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value)
        raise CgroupError(f"cgroup {self.path.name}'s cpu.stat has no usage_usec")

    def kill(self, wait_s: float = WAIT_S) -> bool:
        """End every process of the group and wait (bounded) until it is empty; True if it is."""
        if not self.path.is_dir():
            return True
        if (self.path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.path / "cgroup.kill").write_text("1")
        else:  # before Linux 5.14: frozen, so no process forks while the others are killed
            with contextlib.suppress(OSError, CgroupError):
                self.freeze(True, wait_s=1.0)
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError, CgroupError):
                self.freeze(False, wait_s=1.0)
        deadline = time.monotonic() + wait_s
        while self.pids():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def remove(self, wait_s: float = WAIT_S) -> bool:
        """Kill what is left in the group and remove it with the groups below it; True if gone."""
        emptied = self.kill(wait_s)
        for folder, _, _ in sorted(os.walk(self.path), key=lambda w: len(w[0]), reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        return emptied and not self.path.exists()
