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
  ``prlimit`` bounds processes (the sandbox user's count), file size, open files and, off CUDA,
  address space; ``timeout`` bounds the wall clock of each notebook.
- **Memory and disk.** A memory cgroup per grader (:mod:`.sandbox_memory`: v2 where the machine
  has it, else v1), which every sandboxed command joins before anything else; and per
  submission a size-limited tmpfs (:mod:`.sandbox_disk`) holding all its writable folders, so the
  filesystem counts every byte, files unlinked while open included. Where either cannot be
  had, grade says so once: the address-space limit, and the watchdog's count of files plus the
  unlinked ones its processes hold, remain.
- **One user per grader.** Where graders share a node (a Slurm task per GPU, slurm.py and tasks.py), each one
  claims its own sandbox user (:mod:`.sandbox_users`): ``nobody`` for the first, then the unassigned ids
  from 65000 up. So one submission's fork storm spends its own process count, not its
  neighbour's, and a grader kills only the processes it started itself.
- **GPUs.** A grader's own GPUs' device files and the driver's libraries (:func:`gpu_device_files`,
  :func:`driver_folders`); :func:`gpu_problem` checks that the sandbox sees what the grader sees.

This module builds the command (:meth:`Sandbox.command`: ``timeout``, the memory cgroup,
``prlimit``, ``bwrap`` with its mounts, ``setpriv``); the modules named above hold the rest.

Why bubblewrap: one well-kept program sets up every namespace and mount above, unprivileged
after setup, and it is one ``apt-get install bubblewrap`` (``make test`` installs it as root).
Where it cannot be had (not root, no bwrap, namespaces disabled), :func:`problem` says why, grade
says so once at the start, and grades without a sandbox as before.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from labsupport.grading.cgroups import Group

from . import sandbox_memory
from .sandbox_users import NOBODY, user

# The sandbox user's processes and threads at once (the limit counts threads): OpenMP pools, up to
# 32 Inductor compile workers and DataLoader workers each grow with the node's cores, so the
# limit does too; a fork storm still stops there, its own user's only.
MAX_PROCESSES = max(512, 64 * (os.cpu_count() or 1))
MAX_FILE_BYTES = 2 * 2**30  # one file (the results store holds traces of a few MB)
MAX_OPEN_FILES = 4096
MAX_ADDRESS_SPACE = 32 * 2**30  # off CUDA only: CUDA reserves far more address space than it uses
TMP_BYTES = 2 * 2**30  # /tmp and HOME, in memory
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

    writable: tuple[Path, ...]  # bound read-write at the same path (must belong to user())
    readable: tuple[Path, ...]  # bound read-only at the same path
    env: dict[str, str] = field(default_factory=dict)  # set inside (HOME and TMPDIR are always set)
    budget_s: float | None = None  # wall clock of one command (timeout), None for none
    mounts: tuple[tuple[Path, Path], ...] = ()  # (folder, where it appears): read-write, elsewhere
    group: Path | None = None  # a cgroup v2 group (:func:`.sandbox_memory.group_path`) the command joins, after the memory one

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

        # /dev/shm carries DataLoader workers' batches (about 150 MiB each at a large GPU profile,
        # times workers times prefetch): a quarter of the sandbox's memory, 2 GiB at least.
        shm = max(TMP_BYTES, sandbox_memory.memory_bytes() // 4)
        mounts += ["--dev", "/dev", "--perms", "1777", "--size", str(shm), "--tmpfs", "/dev/shm",
                   "--proc", "/proc", "--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
        python = {Path(sys.base_prefix).resolve(), Path(sys.prefix)}
        for path in sorted(python) + [Path(p) for p in self.readable]:
            mounts += parents(path) + ["--ro-bind-try", str(path), str(path)]
        for source, path in [(p, p) for p in self.writable] + list(self.mounts):
            mounts += parents(Path(path)) + ["--bind", str(source), str(path)]
        if _cuda_present():  # this grader's GPUs' device files, the driver's view of the hardware, its libraries
            own = _visible_gpu_uuids() if _GPU_FILES["own"] else None
            mounts += [a for dev in gpu_device_files(own) for a in ("--dev-bind", str(dev), str(dev))]
            mounts += ["--ro-bind", "/sys", "/sys"]
            for folder in driver_folders():
                mounts += parents(folder) + ["--ro-bind-try", str(folder), str(folder)]
        uid = user()
        # USER and LOGNAME: a spare id has no passwd entry, and getpass.getuser() would fail.
        env = {"HOME": "/tmp/home", "TMPDIR": "/tmp", "USER": "nobody" if uid == NOBODY else f"lab-sandbox-{uid}",
               **self.env}
        env["LOGNAME"] = env["USER"]
        inner = 'mkdir -p "$HOME" && exec "$@"' + (f" >{shlex.quote(str(log))} 2>&1" if log else "")
        # ipykernel exits when its parent (JPY_PARENT_PID) is not its parent any more, which in a
        # new PID namespace it never is; --die-with-parent ends the sandbox with the grader instead.
        setenv = ["--unsetenv", "JPY_PARENT_PID"] + [a for k, v in env.items() for a in ("--setenv", k, str(v))]
        where = ["--chdir", str(cwd)] if cwd else []
        bwrap = ["bwrap", *mounts, *setenv, *where, "--unshare-ipc", "--unshare-pid", "--unshare-net",
                 "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                 "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--", "sh", "-c",
                 (f"{before} && " if before else "") +
                 f"exec setpriv --reuid={uid} --regid={uid} --clear-groups --inh-caps=-all -- "
                 f"sh -c {shlex.quote(inner)} sandboxed " + '"$@"', "sandboxed"]
        wall = ["timeout", "--kill-after=10", f"{max(1, int(self.budget_s))}"] if self.budget_s else []
        procs, _ = sandbox_memory.memory_cgroup()
        # As root, before anything else: the command and all it starts count against the limit.
        join = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs)] if procs else []
        if self.group is not None:  # after the memory one: on a unified machine the group lies below it
            join += Group(self.group).join_command()
        return [*wall, *join, "prlimit", *limits, "--", *bwrap, *argv]


@functools.cache
def _cuda_present() -> bool:
    return any(Path(p).exists() for p in ("/dev/nvidia0", "/dev/nvidiactl"))


# Whether a sandbox gets its grader's GPUs' device files alone (see gpu_device_files); gpu_problem
# turns it off, saying so, on a machine where CUDA in the sandbox then sees no GPU.
_GPU_FILES = {"own": True}


def _visible_gpu_uuids() -> list[str] | None:
    """The UUIDs of the GPUs this grader's torch sees (under ``--jobs`` or Slurm, its slot's alone:
    CUDA_VISIBLE_DEVICES), as the driver writes them ("GPU-..."); None where torch cannot say."""
    try:
        import torch

        uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]
    except Exception:
        return None
    return [u if u.startswith(("GPU-", "MIG-")) else f"GPU-{u}" for u in uuids] or None


def gpu_device_files(uuids: list[str] | None, gpus: Path = Path("/proc/driver/nvidia/gpus"),
                     dev: Path = Path("/dev")) -> list[Path]:
    """The NVIDIA device files a sandbox gets: the driver's shared ones (``nvidiactl``, ``nvidia-uvm``,
    ``nvidia-modeset``, ...) and, of the GPUs' own ``/dev/nvidiaN``, only those of the GPUs with
    ``uuids`` (their ``Device Minor`` in the driver's ``gpus/*/information``). Student code that
    resets CUDA_VISIBLE_DEVICES then still reaches no other GPU: the device files of another slot's
    GPU are not in its sandbox. Every GPU's file where ``uuids`` is None or one of them is not
    found in the driver's list (a MIG slice, a driver that lists none): the grader's probe
    (:func:`gpu_problem`) then still checks that the sandbox sees what the grader sees."""
    shared = [d for d in sorted(dev.glob("nvidia*")) if not re.fullmatch(r"nvidia\d+", d.name)]
    own = {d.name: d for d in sorted(dev.glob("nvidia*")) if re.fullmatch(r"nvidia\d+", d.name)}
    if uuids is None:
        return sorted(shared + list(own.values()))
    minors = {}
    for info in sorted(gpus.glob("*/information")):
        try:
            fields = dict(line.split(":", 1) for line in info.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        uuid, minor = fields.get("GPU UUID", "").strip(), fields.get("Device Minor", "").strip()
        if uuid and minor.isdigit():
            minors[uuid] = f"nvidia{minor}"
    if not all(u in minors and minors[u] in own for u in uuids):
        return sorted(shared + list(own.values()))
    return sorted(shared + [own[minors[u]] for u in uuids])


DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so")


def driver_folders(maps: str | None = None) -> list[Path]:
    """Folders of the NVIDIA driver's libraries this process has loaded that lie outside the
    folders every sandbox sees (a container's ``/usr/local/nvidia`` is inside ``/usr``; a cluster's
    driver under ``/cm/local/apps`` or ``/run/nvidia`` is not). Read from ``/proc/self/maps`` (or
    ``maps``): where torch found the driver, the sandbox's torch must find it too."""
    if maps is None:
        try:
            import torch

            torch.cuda.is_available()  # loads the driver library, if there is one
            maps = Path("/proc/self/maps").read_text()
        except Exception:
            return []
    seen = set()
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if any(Path(path).name.startswith(lib) for lib in DRIVER_LIBRARIES):
            folder = Path(path).parent
            if not any(folder == Path(s) or Path(s) in folder.parents for s in SYSTEM):
                seen.add(folder)
    return sorted(seen)


def _gpus_seen(box: "Sandbox") -> tuple[int, subprocess.CompletedProcess | None]:
    """How many CUDA devices torch sees inside ``box``, and the probe's process (None if it failed)."""
    probe = "import torch; print(torch.cuda.device_count())"
    try:
        done = subprocess.run(box.command([sys.executable, "-c", probe]), capture_output=True, text=True, timeout=300)
        return int(done.stdout.strip().splitlines()[-1]), done
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return 0, None


def gpu_problem(box: "Sandbox") -> str | None:
    """Why a sandbox on this GPU machine would not see its GPU (None when it does, or where the
    grader itself sees none). Grading such a sandbox would measure a CPU and grade it as a GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        want = torch.cuda.device_count()
    except Exception:
        return None
    seen, done = _gpus_seen(box)
    if seen != want and _GPU_FILES["own"]:  # CUDA here may need every GPU's device file to start
        _GPU_FILES["own"] = False
        seen, done = _gpus_seen(box)
        if seen == want:
            print("warning: with only this grader's GPU's device file, CUDA in the sandbox saw no GPU: every "
                  "GPU's device file is bound, and a submission that resets CUDA_VISIBLE_DEVICES could reach "
                  "another slot's GPU on this node", file=sys.stderr)
            return None
    if seen == want:
        return None
    tail = (done.stderr.strip().splitlines() or [""])[-1][:200] if done is not None else ""
    return (f"the grading sandbox sees {seen} of this machine's {want} GPU(s) ({tail or 'no error'}): its "
            f"students would be graded on a CPU as a GPU. The sandbox binds {', '.join(SYSTEM)}, Python, and "
            f"the driver's library folders found ({', '.join(map(str, driver_folders())) or 'none outside those'}); "
            "bind the folder that holds libcuda.so in autograder/sandbox.py's SYSTEM.")
