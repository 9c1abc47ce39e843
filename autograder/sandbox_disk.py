"""Disk: what a submission may write, counted per submission, and the watchdog that stops it.

Each submission's writable folders are made on a size-limited tmpfs of its own (:func:`mount_disk`),
so the filesystem counts every byte, files unlinked while open included. Where none can be
mounted, :func:`disk_used` counts the files in its folders plus the unlinked ones its processes
hold. :func:`watchdog` measures while a notebook runs, and past STORE_BYTES kills it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import threading
from pathlib import Path

from . import sandbox_users

STORE_BYTES = 2 * 2**30  # what a submission may write to its folders on disk (the watchdog's quota)


def mount_disk(folder: Path, size: int) -> str | None:
    """Mount a ``size``-byte tmpfs on ``folder`` (root's, mode 755), where each submission's
    writable folders are made: the filesystem counts every byte they hold, files unlinked while
    open included, and the submission's disk goes when it is unmounted. Returns why not (None
    when mounted): then the watchdog counts files instead."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755,uid=0,gid=0,nosuid,nodev",
                           "lab-submission", str(folder)], capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exited {done.returncode}")


def unmount_below(folder: Path) -> None:
    """Unmount every mount at or below ``folder`` (lazily: a process still holding it cannot keep
    it), deepest first; a grader that crashed leaves its submission's tmpfs behind."""
    folder = str(Path(folder).resolve())
    points = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4].encode().decode("unicode_escape")
                if point == folder or point.startswith(folder + "/"):
                    points.append(point)
    except OSError:
        return
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def is_mount(folder: Path) -> bool:
    return os.path.ismount(folder)


def unlinked_open_bytes() -> int:
    """Bytes held by files this grader's sandboxed processes have open but unlinked: on disk, yet
    in no folder a walk can find."""
    seen, total = set(), 0
    for pid in sandbox_users.ours():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                info = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if info.st_nlink == 0 and (info.st_dev, info.st_ino) not in seen and stat.S_ISREG(info.st_mode):
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def disk_used(folders: tuple[Path, ...], disk: Path | None = None) -> int:
    """A submission's disk use: its tmpfs's own count where it has one, else the files in its
    folders plus the unlinked ones its processes hold open."""
    if disk is not None and is_mount(disk):
        fs = os.statvfs(disk)
        return (fs.f_blocks - fs.f_bfree) * fs.f_frsize
    return folder_bytes(*folders) + unlinked_open_bytes()


def folder_bytes(*paths: Path) -> int:
    """Bytes in the files below ``paths`` (the watchdog's measure of a submission's disk use)."""
    total = 0
    for path in paths:
        for root, _, files in os.walk(path):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass
    return total


@contextlib.contextmanager
def watchdog(folders: tuple[Path, ...], *, enabled: bool = True, every_s: float = 1.0,
             disk: Path | None = None):
    """Watch the disk a submission writes to while its notebook runs; past STORE_BYTES, kill it.

    Measures with :func:`disk_used` (the submission's tmpfs ``disk`` where it has one). Yields an
    object whose ``tripped`` says whether it had to. (The per-file limit alone would let a
    notebook write many files; /tmp and HOME are size-limited tmpfs and need no watching.)
    """
    state = type("Watch", (), {"tripped": False})()
    stop = threading.Event()

    def watch():
        while not stop.wait(every_s):
            sandbox_users.reap()
            if disk_used(folders, disk) > STORE_BYTES:
                state.tripped = True
                sandbox_users.kill_all()

    thread = threading.Thread(target=watch, daemon=True)
    if enabled:
        thread.start()
    try:
        yield state
    finally:
        stop.set()
        if enabled:
            thread.join()
