"""The judge's hold on a worker process (:mod:`.worker`): its requests and replies over the wire
(:mod:`.wire`), its processes frozen or stopped while the other side is timed, the memory it holds
resident read from outside, and its end; and what a worker holds for the judge (:class:`RemoteHeld`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

LOG_CHARS = 2000  # of a worker's own output, kept for a failure's message
# One reply at most (building a data source may decode its split: 6 s at 64 px on 2 cores; a batch
# takes milliseconds). Past it the student's code has hung, and the check fails saying so.
REPLY_TIMEOUT_S = 300.0
# Requests that may take long whatever reply_timeout_s says: the worker's start-up (importing
# torch), the rung's first batch (its source may decode its split first) and its steps, whose first
# ones compile; a notebook's judge side marks its own (:meth:`Sides.ask`'s ``slow``).
SLOW_OPS = ("load", "rung_batch", "rung_step")
class WorkerError(RuntimeError):
    """The student's code raised in its worker, or the worker broke off: the check fails with it."""


class Worker:
    """One worker process, driven by requests (:mod:`.worker`); a context manager that stops it."""

    def __init__(self, role: str, spec: dict, *, prefix: list[str], env: dict[str, str], buffer_bytes: int,
                 reply_timeout_s: float = REPLY_TIMEOUT_S, group=None):
        from . import wire

        self.role, self._wire, self.reply_timeout_s, self.broken = role, wire, reply_timeout_s, ""
        self.group = group  # its cgroup v2 group (:class:`.cgroups.Group`), which ``prefix`` joins; None: none
        to_worker, self._requests = os.pipe()
        self._replies, from_worker = os.pipe()
        buffer_fd, self._map = wire.buffer(buffer_bytes)
        self.view = memoryview(self._map)
        argv = [sys.executable, "-P", "-m", "labsupport.grading.worker",
                json.dumps({**spec, "role": role, "fds": [to_worker, from_worker, buffer_fd]})]
        self.process = subprocess.Popen(prefix + argv, env=env, pass_fds=(to_worker, from_worker, buffer_fd),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, start_new_session=True, cwd="/")
        for fd in (to_worker, from_worker, buffer_fd):
            os.close(fd)
        self._log = ""
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        self.stopped = False

    def _drain(self) -> None:
        for chunk in iter(lambda: self.process.stderr.read1(4096), b""):
            self._log = (self._log + chunk.decode(errors="replace"))[-LOG_CHARS:]

    def request(self, op: str, *, slow: bool = False, **fields) -> dict:
        """Send one request and wait for its reply (a WorkerError if the worker raised, broke off or
        did not answer in :data:`REPLY_TIMEOUT_S`; ``slow``: one that may take long, as
        :data:`SLOW_OPS`). A stopped worker asked for something runs again."""
        if self.broken:  # its replies can no longer be paired with requests
            raise WorkerError(self.broken)
        self.pause(False)
        try:
            self._wire.send(self._requests, {"op": op, **fields})
            # The first request also waits for the worker to start (importing torch: seconds).
            reply = self._wire.receive(self._replies, max(self.reply_timeout_s, REPLY_TIMEOUT_S)
                                       if slow or op in SLOW_OPS else self.reply_timeout_s)
        except Exception as err:  # fails closed: whatever broke the reply, none after it pairs with its request
            if not isinstance(err, self._wire.WireError):
                err = f"{type(err).__name__}: {str(err)[:200]}"
            last = self._log.strip().splitlines()[-1:] or [""]
            self.broken = (f"your code's worker broke off at its '{op}' request ({err}"
                           + (f" within {self.reply_timeout_s:.0f} s" if "in time" in str(err) else "")
                           + f"); its last words: {last[0][:300]}")
            raise WorkerError(self.broken) from None
        if "error" in reply:
            raise WorkerError(str(reply["error"])[:600])
        return reply

    def tensors(self, reply: dict) -> list:
        return self._wire.take(self.view, reply.get("tensors"))

    def _tree(self) -> list[int]:
        """This worker's processes: its first one and every process below it."""
        children: dict[int, list[int]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    with open(f"/proc/{entry.name}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    children.setdefault(ppid, []).append(int(entry.name))
        found, todo = [], [self.process.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found

    def _resident(self, pids: list[int]) -> int:
        """Bytes of memory the kernel holds resident for ``pids`` now, as ``/proc/PID/status``
        gives them (what no code in them can under-report): anonymous memory and shared memory
        (tmpfs, ``/dev/shm``), not the pages of mapped files such as the libraries' code, which
        come and go with what runs and are the same data however much a step holds."""
        total = 0
        for pid in pids:
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith(("RssAnon:", "RssShmem:")):
                            total += int(line.split()[1]) * 1024
        return total

    def resident_peak(self, fn):
        """``fn()`` (requests to this worker), and the most memory this worker's processes held
        resident meanwhile, sampled from outside every millisecond (its process tree looked up
        again every 50 samples, so a child it starts is counted); None where none could be read."""
        stop, peak = threading.Event(), [0]

        def sample():
            pids, n = self._tree(), 0
            while True:  # once at least, however short the request
                peak[0] = max(peak[0], self._resident(pids))
                if stop.is_set():
                    break
                n += 1
                if n % 50 == 0:
                    pids = self._tree()
                time.sleep(0.001)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            value = fn()
        finally:
            stop.set()
            sampler.join()
        return value, peak[0] or None  # None: nothing could be read (no /proc to see it in)

    def pause(self, stop: bool) -> None:
        """Stop (or continue) every process of this worker: while the other side is timed. Its group
        frozen as a whole (returns once the kernel says so); without one, SIGSTOP to the processes
        listed below it now, which misses any that forks away meanwhile (speed is then not graded)."""
        if stop == self.stopped:
            return
        if self.group is not None:
            self.group.freeze(stop)
            self.stopped = stop
            return
        for pid in self._tree():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP if stop else signal.SIGCONT)
        self.stopped = stop

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.pause(False)
        with contextlib.suppress(Exception):
            self._wire.send(self._requests, {"op": "quit"})
        for fd in (self._requests, self._replies):
            with contextlib.suppress(OSError):
                os.close(fd)
        try:
            self.process.wait(timeout=1 if self.broken else 10)
        except subprocess.TimeoutExpired:
            if self.group is not None:
                self.group.kill()
            for pid in reversed(self._tree()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            self.process.wait()
        with contextlib.suppress(BufferError):  # a tensor still viewing it: the process ends soon
            self.view.release()
            self._map.close()


class RemoteHeld:
    """Something held in a worker: each of its methods ``asked`` is a request, and what it returns
    comes back as a number, plain data or plain tensors; iterated, it yields the judge's
    own copies of each batch the worker produced."""

    def __init__(self, worker: Worker, handle: int, asked: tuple[str, ...], *, slow: tuple[str, ...] = (),
                 length: int | None = None):
        self.worker, self.handle, self.asked, self.slow, self.length = worker, handle, asked, slow, length

    def __getattr__(self, method: str):
        if method.startswith("_") or method not in self.asked:
            raise AttributeError(method)

        def ask(**args):
            reply = self.worker.request("ask", handle=self.handle, method=method, args=args, slow=method in self.slow)
            if "tensors" not in reply:
                return reply.get("value")
            tensors = self.worker.tensors(reply)
            return tensors[0] if reply.get("one") else tensors
        return ask

    def __bool__(self) -> bool:  # held, whatever its length
        return True

    def __len__(self):
        if self.length is None:
            raise TypeError("this object has no len()")
        return self.length

    def __iter__(self):
        handle = self.worker.request("iter", handle=self.handle)["handle"]
        while True:
            reply = self.worker.request("next", handle=handle)
            if reply.get("stop"):
                return
            images, labels = self.worker.tensors(reply)
            yield images, labels
