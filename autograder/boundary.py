"""The trust boundary: how the grader, running as root, takes anything a sandboxed process wrote.

A sandboxed process (a student's kernel, a verdict process) runs as an unprivileged user and may
leave anything in the folders it could write: links to the grader's own files, FIFOs, devices,
files of any size, files that change while they are read. Root therefore never follows, opens,
chmods or writes by path anything in those folders. It takes what it needs only through this
module:

- :func:`read`: one file, each path component opened without following a link, the file itself
  checked to be a regular file (a FIFO would block the grader forever) and read up to a cap;
- :func:`copy_file` and :func:`copy_tree`: such reads, written into a folder root made and
  owns, links and special files skipped with a note;
- :func:`run`: a sandboxed command whose stdout and stderr come back over a pipe the grader
  owns, kept up to a cap (the rest is read and dropped, so the process never blocks on it), and
  whose wall clock is bounded;
- :func:`socket_of`: a Unix socket a sandboxed process bound (a kernel's channel), held by a
  descriptor that root then connects through (:mod:`.kernel`), never by its path.

Inputs go the other way: root writes them into a fresh folder it owns, which the sandbox sees
read-only (submission.py), so nothing the sandbox could have replaced is ever written through.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

FILE_BYTES = 64 * 2**20  # one file root takes from a sandbox (a trace, a report, a verdict)
TREE_BYTES = 256 * 2**20  # one folder root copies out of a sandbox (a results store), all files together
OUTPUT_BYTES = 256 * 2**10  # what the grader keeps of a sandboxed command's stdout and stderr


class Refused(OSError):
    """Root would not take a file a sandboxed process wrote: why, in one sentence."""


def _open_below(folder: Path, name: str) -> int:
    """A read-only descriptor of ``folder/name``, with no link followed in ``name`` and the file
    a regular one. ``folder`` itself must be a path no sandboxed process can change (each of its
    components made by root); ``name`` may have several components."""
    parts = Path(name).parts
    if not parts or any(p in ("..", "/") for p in parts):
        raise Refused(f"{name!r} is not a plain relative path")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as err:
                raise Refused(f"{part!r} in {name} is not a folder ({err.strerror})") from None
            os.close(fd)
            fd = nxt
        try:
            # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer.
            leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except FileNotFoundError:
            raise
        except OSError as err:  # ELOOP: a link
            raise Refused(f"{name} is not a regular file ({err.strerror})") from None
    finally:
        os.close(fd)
    mode = os.fstat(leaf).st_mode
    if not stat.S_ISREG(mode):
        os.close(leaf)
        raise Refused(f"{name} is not a regular file ({stat.filemode(mode)})")
    return leaf


def read(folder: Path, name: str, cap: int = FILE_BYTES) -> bytes:
    """The bytes of ``folder/name`` (see :func:`_open_below`), at most ``cap`` of them: a longer
    file raises :class:`Refused`. FileNotFoundError where there is none."""
    fd = _open_below(Path(folder), name)
    try:
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, min(2**20, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > cap:
        raise Refused(f"{name} is larger than {cap // 2**20} MiB")
    return b"".join(chunks)


def _mtime(folder: Path, name: str) -> int:
    fd = _open_below(Path(folder), name)
    try:
        return os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)


def write(dest: Path, data: bytes, mtime_ns: int | None = None) -> None:
    """``data`` into ``dest``, a path in a folder root owns: a new file, no link followed."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if mtime_ns is not None:
            os.utime(fd, ns=(mtime_ns, mtime_ns))
    finally:
        os.close(fd)
    os.replace(tmp, dest)


def give(folder: Path, name: str, data: bytes, owner: int | None = None) -> None:
    """``data`` as ``folder/name``, in a folder a sandboxed process may have written in (a store
    of its own), while none runs: whatever lies at ``name`` (a file, a link) is removed, not
    followed, and a new regular file made in its place, given to ``owner``. ``folder`` itself must
    be root's path, as for :func:`read`; ``name`` one component."""
    if Path(name).name != name or name in ("", ".", ".."):
        raise Refused(f"{name!r} is not a plain file name")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError as err:  # a folder in its place
            raise Refused(f"{name} in {folder} could not be replaced ({err.strerror})") from None
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
            if owner is not None:
                os.fchown(out, owner, owner)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def socket_of(folder: Path, name: str, uid: int) -> int:
    """An ``O_PATH`` descriptor of the Unix socket ``folder/name``, checked to be a socket that
    user ``uid`` bound, nothing followed and nothing opened for I/O: a connection through it
    (``/proc/<pid>/fd/<fd>``, :mod:`.kernel`) reaches that very socket, whatever is put at
    ``name`` afterwards. FileNotFoundError where there is none yet; :class:`Refused` for anything
    else at ``name`` (a link, a file, another user's socket). ``folder`` must be root's path, as
    for :func:`read`; ``name`` one component."""
    if Path(name).name != name or name in ("", ".", ".."):
        raise Refused(f"{name!r} is not a plain file name")
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        # O_PATH with O_NOFOLLOW opens a link itself (it does not fail): fstat below refuses it.
        leaf = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
    info = os.fstat(leaf)
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != uid:
        os.close(leaf)
        kind = "a link" if stat.S_ISLNK(info.st_mode) else stat.filemode(info.st_mode)
        raise Refused(f"{name} is not a socket the sandbox bound ({kind}, owner {info.st_uid})")
    return leaf


def copy_file(folder: Path, name: str, dest: Path, cap: int = FILE_BYTES) -> None:
    """:func:`read` ``folder/name`` and :func:`write` it to ``dest``, keeping its modification time
    (06's report check asks whether the kernel wrote it)."""
    mtime = _mtime(folder, name)
    write(dest, read(folder, name, cap), mtime)


def copy_tree(source: Path, dest: Path, *, file_cap: int = FILE_BYTES, total_cap: int = TREE_BYTES) -> list[str]:
    """Copy the regular files below ``source`` (a folder a sandbox wrote, whose path it cannot
    change) into ``dest`` (made here), without following any link; returns what was skipped.

    Walks by descriptor (``os.fwalk``), so a folder swapped for a link mid-walk is not entered.
    """
    skipped, total = [], 0
    dest.mkdir(parents=True, exist_ok=True)
    for top, dirs, files, top_fd in os.fwalk(source, follow_symlinks=False):
        rel = Path(top).relative_to(source)
        for name in sorted(dirs):
            if stat.S_ISDIR(os.stat(name, dir_fd=top_fd, follow_symlinks=False).st_mode):
                (dest / rel / name).mkdir(exist_ok=True)  # fwalk enters it by descriptor, never a link
            else:
                skipped.append(f"{rel / name}: a link, not followed")
        for name in sorted(files):
            where = rel / name
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=top_fd)
            except OSError as err:
                skipped.append(f"{where}: {err.strerror}")
                continue
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    skipped.append(f"{where}: not a regular file ({stat.filemode(info.st_mode)})")
                    continue
                if info.st_size > file_cap or total + info.st_size > total_cap:
                    skipped.append(f"{where}: {info.st_size} bytes, over the cap")
                    continue
                os.set_blocking(fd, True)
                data = os.read(fd, file_cap + 1) if info.st_size else b""
                while len(data) <= file_cap and (more := os.read(fd, file_cap + 1 - len(data))):
                    data += more
            finally:
                os.close(fd)
            if len(data) > file_cap or total + len(data) > total_cap:
                skipped.append(f"{where}: grew past the cap while read")
                continue
            total += len(data)
            write(dest / where, data, info.st_mtime_ns)
    return skipped


@dataclass
class Finished:
    """How a bounded command ended."""

    returncode: int | None  # None: killed at its time limit
    output: str  # the first and last OUTPUT_BYTES / 2 of stdout and stderr together
    seconds: float
    dropped: int = 0  # bytes of output read and not kept

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def last_line(self) -> str:
        lines = self.output.strip().splitlines()
        return lines[-1][:300] if lines else "no output"


def run(argv: list[str], *, env: dict[str, str], timeout_s: float, cap: int = OUTPUT_BYTES,
        on_timeout=None) -> Finished:
    """Run ``argv`` (a sandboxed command), its output over a pipe kept up to ``cap`` bytes, for at
    most ``timeout_s``; then its process group is killed, and ``on_timeout`` (the sandbox's
    kill_all) ends whatever it started elsewhere."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    head, tail, counts = bytearray(), bytearray(), {"dropped": 0}
    half = cap // 2

    def drain():
        while chunk := proc.stdout.read1(2**16):
            if len(head) < half:
                take = chunk[:half - len(head)]
                head.extend(take)
                chunk = chunk[len(take):]
            tail.extend(chunk)
            if len(tail) > half:
                counts["dropped"] += len(tail) - half
                del tail[:len(tail) - half]

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if on_timeout:
            on_timeout()
    except BaseException:  # the grader was stopped (autograder/stopping.py): what it started ends with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    reader.join(timeout=5)  # a grandchild still holding the pipe cannot hold the grader
    proc.stdout.close()
    text = bytes(head).decode(errors="replace")
    if counts["dropped"]:
        text += f"\n... {counts['dropped']} bytes of output dropped by the grader ...\n"
    text += bytes(tail).decode(errors="replace")
    return Finished(code, text, time.perf_counter() - started, counts["dropped"])
