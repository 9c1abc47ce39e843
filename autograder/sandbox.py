"""A sandbox per submission: what a student's kernel and its verdict process can see and do.

``grade`` runs each notebook's kernel, and the verdict process after it, inside bubblewrap
(``bwrap``, Debian's ``bubblewrap``: the sandbox Flatpak uses), launched as root and dropping to
the unprivileged user ``nobody`` inside:

- **Files.** A new root holding only the system folders (read-only), the Python installation and
  virtual environment (read-only), a read-only, non-editable copy of labsupport, the dataset
  (read-only), and the submission's own writable folders: its autograded folder and its kernel
  results store. The course root, the masters, the gradebook, the checkout and other students'
  folders are not there at all. ``/tmp`` and ``HOME`` are fresh, size-limited tmpfs.
- **Network.** None (a new network namespace). The kernel talks to nbgrader over Unix sockets
  (Jupyter's ``ipc`` transport) in a folder bound into the sandbox.
- **Processes.** A new PID namespace: when the kernel ends, every process it started ends too.
  ``prlimit`` bounds processes (``nobody``'s count), file size, open files and, off CUDA, address
  space; ``timeout`` bounds the wall clock of each notebook.

Why bubblewrap: one well-kept program sets up every namespace and mount above, unprivileged
after setup, and it is one ``apt-get install bubblewrap`` (``make test`` installs it as root).
Where it cannot be had (not root, no bwrap, namespaces disabled), :func:`problem` says why, grade
says so once at the start, and grades without a sandbox as before.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

NOBODY = 65534  # the unprivileged user the sandboxed processes run as
MAX_PROCESSES = 512  # nobody's processes at once: DataLoader workers and compile workers fit
MAX_FILE_BYTES = 2 * 2**30  # one file (the results store holds traces of a few MB)
MAX_OPEN_FILES = 4096
MAX_ADDRESS_SPACE = 32 * 2**30  # off CUDA only: CUDA reserves far more address space than it uses
TMP_BYTES = 2 * 2**30  # /tmp and HOME, in memory
STORE_BYTES = 2 * 2**30  # what a submission may write to its folders on disk (the watchdog's quota)
SYSTEM = ("/usr", "/etc", "/opt")  # bound read-only where they exist
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")  # usr-merged links, or binds


def problem() -> str | None:
    """Why no sandbox can be had here (None when it can): checked once per grading process."""
    return _probe()


@functools.cache
def _probe() -> str | None:
    if sys.platform != "linux":
        return f"sandboxing needs Linux namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "grading runs as a normal user: the sandbox drops to user nobody, which needs root"
    for tool in ("bwrap", "setpriv", "prlimit", "timeout"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install bubblewrap util-linux coreutils)"
    probe = Sandbox(writable=(), readable=()).command([sys.executable, "-c", "print('ok')"])
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap could not start ({err})"
    if done.stdout.strip() != "ok":
        return f"bwrap could not start: {(done.stderr or done.stdout).strip()[:300]}"
    return None


def _ancestors(path: Path) -> list[Path]:
    return list(reversed(Path(path).parents))[1:]  # without "/"


@dataclass(frozen=True)
class Sandbox:
    """The sandbox of one submission: what it may write and read, beside the system and Python."""

    writable: tuple[Path, ...]  # bound read-write at the same path (must belong to NOBODY)
    readable: tuple[Path, ...]  # bound read-only at the same path
    env: dict[str, str] = field(default_factory=dict)  # set inside (HOME and TMPDIR are always set)
    budget_s: float | None = None  # wall clock of one command (timeout), None for none
    mounts: tuple[tuple[Path, Path], ...] = ()  # (folder, where it appears): read-write, elsewhere

    def command(self, argv: list[str], *, cwd: Path | None = None, before: str = "",
                log: Path | None = None) -> list[str]:
        """``argv`` wrapped: timeout, prlimit, bwrap with this sandbox's mounts, setpriv to nobody.

        ``before`` is a shell command run inside the sandbox, still as root (without capabilities
        beyond changing user), before dropping to nobody: the kernel's copy of its connection file.
        ``log`` (in a writable folder) receives the command's own stdout and stderr.
        """
        limits = [f"--nproc={MAX_PROCESSES}", f"--fsize={MAX_FILE_BYTES}", f"--nofile={MAX_OPEN_FILES}"]
        if not _cuda_present():
            limits.append(f"--as={MAX_ADDRESS_SPACE}")
        mounts: list[str] = []
        for folder in SYSTEM:
            mounts += ["--ro-bind-try", folder, folder]
        for link in SYSTEM_LINKS:
            if os.path.islink(link):
                mounts += ["--symlink", os.readlink(link), link]
            elif os.path.isdir(link):
                mounts += ["--ro-bind", link, link]
        made: set[Path] = set()

        def parents(path: Path) -> list[str]:
            args = []
            for parent in _ancestors(path):
                if parent not in made and str(parent) not in SYSTEM + ("/tmp",):
                    made.add(parent)
                    args += ["--perms", "0755", "--dir", str(parent)]
            return args

        mounts += ["--dev", "/dev", "--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/dev/shm",
                   "--proc", "/proc", "--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
        python = {Path(sys.base_prefix).resolve(), Path(sys.prefix)}
        for path in sorted(python) + [Path(p) for p in self.readable]:
            mounts += parents(path) + ["--ro-bind-try", str(path), str(path)]
        for source, path in [(p, p) for p in self.writable] + list(self.mounts):
            mounts += parents(Path(path)) + ["--bind", str(source), str(path)]
        if _cuda_present():  # the GPU's device files, and the driver's view of the hardware
            mounts += [a for dev in sorted(Path("/dev").glob("nvidia*")) for a in ("--dev-bind", str(dev), str(dev))]
            mounts += ["--ro-bind", "/sys", "/sys"]
        env = {"HOME": "/tmp/home", "TMPDIR": "/tmp", **self.env}
        inner = 'mkdir -p "$HOME" && exec "$@"' + (f" >{shlex.quote(str(log))} 2>&1" if log else "")
        # ipykernel exits when its parent (JPY_PARENT_PID) is not its parent any more, which in a
        # new PID namespace it never is; --die-with-parent ends the sandbox with the grader instead.
        setenv = ["--unsetenv", "JPY_PARENT_PID"] + [a for k, v in env.items() for a in ("--setenv", k, str(v))]
        where = ["--chdir", str(cwd)] if cwd else []
        bwrap = ["bwrap", *mounts, *setenv, *where, "--unshare-ipc", "--unshare-pid", "--unshare-net",
                 "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                 "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--", "sh", "-c",
                 (f"{before} && " if before else "") +
                 f"exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups --inh-caps=-all -- "
                 f"sh -c {shlex.quote(inner)} sandboxed " + '"$@"', "sandboxed"]
        wall = ["timeout", "--kill-after=10", f"{int(self.budget_s)}"] if self.budget_s else []
        return [*wall, "prlimit", *limits, "--", *bwrap, *argv]


@functools.cache
def _cuda_present() -> bool:
    return any(Path(p).exists() for p in ("/dev/nvidia0", "/dev/nvidiactl"))


def own(*paths: Path) -> None:
    """Give ``paths`` (folders, recursively) to the sandbox user, so it can write there."""
    for path in paths:
        path.mkdir(parents=True, exist_ok=True)
        for root, dirs, files in os.walk(path):
            os.chown(root, NOBODY, NOBODY)
            for name in files:
                os.chown(os.path.join(root, name), NOBODY, NOBODY, follow_symlinks=False)


def kill_all() -> None:
    """Kill every process of the sandbox user (grading runs one submission at a time)."""
    subprocess.run(["pkill", "-KILL", "-u", str(NOBODY)], capture_output=True)


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
def watchdog(folders: tuple[Path, ...], *, enabled: bool = True, every_s: float = 1.0):
    """Watch the disk a submission writes to while its notebook runs; past STORE_BYTES, kill it.

    Yields an object whose ``tripped`` says whether it had to. (The per-file limit alone would let
    a notebook write many files; /tmp and HOME are size-limited tmpfs and need no watching.)
    """
    state = type("Watch", (), {"tripped": False})()
    stop = threading.Event()

    def watch():
        while not stop.wait(every_s):
            if folder_bytes(*folders) > STORE_BYTES:
                state.tripped = True
                kill_all()

    thread = threading.Thread(target=watch, daemon=True)
    if enabled:
        thread.start()
    try:
        yield state
    finally:
        stop.set()
        if enabled:
            thread.join()
