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
- **Memory and disk.** A memory cgroup per grader (:func:`memory_cgroup`: v2 where the machine
  has it, else v1), which every sandboxed command joins before anything else; and per
  submission a size-limited tmpfs (:func:`mount_disk`) holding all its writable folders, so the
  filesystem counts every byte, files unlinked while open included. Where either cannot be
  had, grade says so once: the address-space limit, and the watchdog's count of files plus the
  unlinked ones its processes hold (:func:`disk_used`), remain.
- **One user per grader.** Where graders share a node (a Slurm task per GPU, slurm.py and tasks.py), each one
  claims its own sandbox user (:func:`user`): ``nobody`` for the first, then the unassigned ids
  from 65000 up. So one submission's fork storm spends its own process count, not its
  neighbour's, and a grader kills only the processes it started itself (:func:`kill_all`).

Why bubblewrap: one well-kept program sets up every namespace and mount above, unprivileged
after setup, and it is one ``apt-get install bubblewrap`` (``make test`` installs it as root).
Where it cannot be had (not root, no bwrap, namespaces disabled), :func:`problem` says why, grade
says so once at the start, and grades without a sandbox as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import signal
import shlex
import stat
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from labsupport.grading import cgroups
from labsupport.grading.cgroups import Group

NOBODY = 65534  # the unprivileged user the sandboxed processes run as (the first grader's)
# Further graders on the same machine: ids Debian reserves and never assigns (65000-65533), so no
# real user's processes or files are ever theirs. A grader holds its id by a lock file.
SPARE_USERS = range(65000, 65534)
PR_SET_CHILD_SUBREAPER = 36  # prctl option (linux/prctl.h)
USER_LOCKS = Path("/run/lock") if Path("/run/lock").is_dir() else Path(tempfile.gettempdir())
# The sandbox user's processes and threads at once (the limit counts threads): OpenMP pools, up to
# 32 Inductor compile workers and DataLoader workers each grow with the node's cores, so the
# limit does too; a fork storm still stops there, its own user's only.
MAX_PROCESSES = max(512, 64 * (os.cpu_count() or 1))
MAX_FILE_BYTES = 2 * 2**30  # one file (the results store holds traces of a few MB)
MAX_OPEN_FILES = 4096
MAX_ADDRESS_SPACE = 32 * 2**30  # off CUDA only: CUDA reserves far more address space than it uses
TMP_BYTES = 2 * 2**30  # /tmp and HOME, in memory
STORE_BYTES = 2 * 2**30  # what a submission may write to its folders on disk (the watchdog's quota)
SYSTEM = ("/usr", "/etc", "/opt")  # bound read-only where they exist
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")  # usr-merged links, or binds


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
    group: Path | None = None  # a cgroup v2 group (:func:`group_path`) the command joins, after the memory one

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
        shm = max(TMP_BYTES, memory_bytes() // 4)
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
        procs, _ = memory_cgroup()
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
    uid, me = user(), os.getpid()
    deadline = time.monotonic() + wait_s
    for group in _GROUPS:  # by cgroup first: a group's forks cannot escape it, as they can a pid walk
        Group(group).kill(wait_s=min(wait_s, cgroups.WAIT_S))
    while True:
        table = _processes()
        ours = [pid for pid in _descendants(me, table) if _real_uid(pid) == uid]
        for pid in ours:
            if table[pid][1] != "Z":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            elif table[pid][0] == me:  # a zombie left to us: reap it, or it keeps its slot
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
        if not ours or time.monotonic() > deadline:
            reap()
            return
        time.sleep(0.05)


# The cgroup v2 groups of this grader's sandboxes (:func:`track`), which :func:`kill_all` ends as a whole.
_GROUPS: list[Path] = []


def track(group: Path) -> None:
    """Have :func:`kill_all` end every process of ``group`` (a submission's, :func:`group_path`) too."""
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


# --- memory: a cgroup per grader ---------------------------------------------------------------

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


# --- disk: a size-limited filesystem per submission --------------------------------------------

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
    uid, seen, total = user(), set(), 0
    for pid in _descendants(os.getpid(), _processes()):
        if _real_uid(pid) != uid:
            continue
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
            reap()
            if disk_used(folders, disk) > STORE_BYTES:
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
