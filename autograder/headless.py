"""A notebook run headless, one kernel at a time: started, measured, and ended with all it started.

``make run``, the Colab stand-in and 08's test run notebooks through :func:`execute`. nbclient
shuts down only a kernel it started itself; handed a kernel manager of ours (for the ipc transport)
it shut down none, and ``make run`` kept every notebook's kernel alive, 16.4 GB at the end on class
cpu-bf16 (issue 62). :func:`execute` ends the kernel and every process below it (DataLoader and
compile workers) before it returns or raises: done, an error, a cell's timeout, or SIGINT and
SIGTERM under :func:`.stopping.on_signals` (the command line's). :class:`TreePeak` samples a
process tree's memory from outside, so that any command can print a kernel's peak (``grade``'s
kernels are process trees too).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import time
from pathlib import Path

import psutil

SAMPLE_EVERY_S = 0.05  # the tree's memory read: 0.05 ms of CPU for 4 processes
LIST_EVERY_S = 1.0  # the tree listed again: psutil reads every process's /proc/<pid>/stat to find
# children, 35 ms of CPU on a machine of 2,200 processes. Both: 4% of a core there.


class TreePeak:
    """The peak resident memory (``peak_bytes``) of process ``pid`` and all its descendants
    together, sampled from outside every ``every_s`` seconds in a thread while a ``with`` block
    runs (the descendants listed every LIST_EVERY_S: a process that lives less may go uncounted).

    The sum of the processes' RSS counts a page a forked DataLoader worker shares with its kernel
    twice: an upper bound of what the tree held, as ``ps`` and ``top`` show it (a process holding
    200 MB of tensors and 2 workers: 1.87 GiB of RSS, 0.53 GiB of PSS). PSS, read from
    ``smaps_rollup``, cost 100 ms of CPU a sample of 3 processes here, against 0.04 ms for RSS."""

    def __init__(self, pid: int, every_s: float = SAMPLE_EVERY_S):
        self.pid, self.every_s, self.peak_bytes = pid, every_s, 0
        self._tree: list[psutil.Process] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, name=f"tree-peak-{pid}", daemon=True)

    def __enter__(self) -> "TreePeak":
        self.sample(relist=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample_until_stopped(self) -> None:
        listed = time.monotonic()
        while not self._stop.wait(self.every_s):
            relist = time.monotonic() - listed >= LIST_EVERY_S
            self.sample(relist)
            listed = time.monotonic() if relist else listed

    def sample(self, relist: bool = True) -> int:
        """The tree's RSS now, in bytes (0 once its root is gone), kept in ``peak_bytes`` if
        higher; ``relist``: its descendants listed again first."""
        if relist:
            try:
                root = psutil.Process(self.pid)
                self._tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                self._tree = []
        now = 0
        for process in self._tree:
            with contextlib.suppress(psutil.Error):  # one that ended since the listing holds nothing
                now += process.memory_info().rss
        self.peak_bytes = max(self.peak_bytes, now)
        return now


class _CallersSignals(asyncio.SelectorEventLoop):
    """An event loop that leaves SIGINT and SIGTERM to the caller.

    While it executes, nbclient (0.10-0.11, ``async_setup_kernel``) turns both into a shutdown of
    the kernel and nothing more, and then sets SIGTERM back to its default: ``run`` sent either
    during a notebook was still running 60 s later. nbclient skips its handlers where the loop
    refuses them (RuntimeError, as outside the main thread)."""

    def add_signal_handler(self, sig, callback, *args):
        raise RuntimeError("the caller handles SIGINT and SIGTERM")


def execute(nb, folder: Path, *, timeout_s: int, kernel_name: str = "python3", allow_errors: bool = False,
            log=None) -> int:
    """Execute notebook ``nb`` in place in a new kernel working in ``folder``, and end the kernel
    and every process below it however the run ends. Returns their peak RSS together, in bytes.

    The kernel's stdout and stderr go to ``log`` (a file), else to this process's. As nbclient's
    ``execute``: a cell's error raises CellExecutionError unless ``allow_errors``, a cell running
    past ``timeout_s`` raises CellTimeoutError.
    """
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    with tempfile.TemporaryDirectory(prefix="lab-kernel-") as sockets, \
            asyncio.Runner(loop_factory=_CallersSignals) as runner:
        # The ipc transport (Unix sockets in a private folder): a kernel on TCP without CurveZMQ
        # keys logs "Kernel is running over TCP without encryption" (ipykernel's kernelapp.py) at
        # every start, a warning a newcomer reads as a fault; over Unix sockets only this user
        # can connect, and nothing is printed. The async manager: with jupyter_client's blocking
        # one, nbclient never timed a cell out (time.sleep(15) past a 3 s timeout ran 17 s).
        km = AsyncKernelManager(kernel_name=kernel_name, transport="ipc", ip=str(Path(sockets) / "kernel"))
        client = NotebookClient(nb, km=km, timeout=timeout_s, allow_errors=allow_errors,
                                resources={"metadata": {"path": str(folder)}})
        try:
            runner.run(client.async_start_new_kernel(stdout=log, stderr=log))  # nbclient's: cwd, history in memory
            with TreePeak(km.provisioner.pid) as peak:
                runner.run(client.async_execute())
        finally:
            runner.run(end(km, client.kc))
    return peak.peak_bytes


async def end(km, kc=None) -> None:
    """End kernel ``km`` (an AsyncKernelManager) and every process below it now, and close client
    ``kc``'s channels.

    jupyter_client starts a kernel in a session of its own and kills its process group
    (``shutdown_kernel(now=True)``: SIGKILL); a descendant that left the group (``setsid``) is
    killed by pid, as listed before the kernel died (after, it belongs to init)."""
    if kc is not None:
        kc.stop_channels()
    if not km.has_kernel:
        return
    try:
        below = psutil.Process(km.provisioner.pid).children(recursive=True)
    except psutil.Error:
        below = []
    await km.shutdown_kernel(now=True)
    for process in below:
        with contextlib.suppress(psutil.Error):  # psutil checks the pid still names that process
            process.kill()
    psutil.wait_procs(below, timeout=10)
