"""A graded notebook's kernel in the sandbox: its kernel spec (:func:`spec`), and root's side of
its channels, reached through descriptors, never by a path the sandbox holds.

A sandboxed kernel binds its five channels (shell, iopub, stdin, control, heartbeat) as Unix
sockets (Jupyter's ``ipc`` transport) in its run folder, which it owns and writes, and which the
sandbox shows it at a short path of its own (:data:`SOCKETS`): a Unix socket's path holds at most
107 bytes, and the run folder's own path lies below the course root, as long as the instructor's
(a kernel bound there failed to start once that path passed 107 bytes: under ``make test``'s
``/tmp/pytest-of-root/pytest-N/popen-gwN/...``, each notebook "failed to run" at once). A client that
connects by those paths reconnects by them after every dropped connection (zmq, every 100 ms) and
after every missed heartbeat (jupyter_client opens a new heartbeat socket each second): a kernel
that put a link at a channel's name made the grader ``connect()``, as root, 71 times in 6 s to a
Unix socket of its choosing outside the sandbox (issue 60; tests/test_kernel.py on that code: 127
connections in 10 s through a heartbeat link, 431 through a shell link).

So :class:`PinnedKernelManager` (nbgrader's Execute uses it for a sandboxed kernel, see
:func:`settings`) waits, bounded, for the kernel to bind its five sockets, opens each without
following anything and checks that it is a socket the sandbox user bound
(:func:`.boundary.socket_of`), keeps the descriptors, and points every connection of root's
(nbgrader's client, the control socket its interrupts at a cell's time limit go through) at
links in a root-only folder that lead to ``/proc/<grader>/fd/<N>``. procfs resolves such a link to
the file the descriptor holds, not to a path, so ``connect()`` reaches exactly the socket root
checked, whatever the sandbox later does to its folder: a name replaced or removed leaves root
reconnecting to the same socket, or refused. The kernel binds at its own path. The connection
file is root's, in a root-only folder the sandbox sees read-only (its root copies the file in
before dropping to the sandbox user). In the run folder root does nothing else by path: it makes
the folder anew before the kernel starts (submission.py) and removes it once the sandbox is gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Float, Unicode

from . import boundary, sandbox, sandbox_users

# The kernel's ipc "ports" (its socket files are <ip>-<port>), fixed: jupyter_client would
# otherwise pick free ones by testing paths in the kernel's folder (os.path.exists).
PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
# Where root's links go: short (a Unix socket's path holds at most 107 bytes), root's own.
LINKS_IN = "/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()
POLL_S = 0.05  # between looks for the kernel's sockets while it starts
SPEC = "lab-sandbox"  # the kernel spec's name
# Where the sandbox shows the kernel its run folder, and so where it binds its channels: short,
# whatever the course root's path (a Unix socket's path holds at most IPC_PATH_MAX bytes).
SOCKETS = Path("/run/kernel")
IPC_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux (zmq.IPC_PATH_MAX_LEN)
LOG = "kernel.log"  # the kernel process's own output, in its run folder


def spec(folder: Path, box: sandbox.Sandbox, log: Path, run: Path | None = None) -> None:
    """A kernel spec ``lab-sandbox`` in ``folder`` (put on JUPYTER_PATH) that starts IPython in ``box``.

    nbgrader writes the connection file (mode 600, root's) into root's own folder, which the
    sandbox sees read-only (:func:`settings`); the sandbox's root copies it to its own /tmp for the
    kernel, which runs as nobody and binds its channels in ``run``, its run folder (one of
    ``box``'s writable folders; default: ``log``'s folder), which the sandbox also shows it at
    :data:`SOCKETS`, where the connection file says to bind. The kernel process's own output (its
    banner, C++ libraries' logging) goes to ``log`` (:data:`LOG` in its run folder, where
    :func:`output` finds it), not the grader's terminal.
    """
    box = replace(box, mounts=(*box.mounts, (Path(run or Path(log).parent), SOCKETS)))
    argv = box.command([sys.executable, "-m", "ipykernel_launcher", "-f", "/tmp/kernel.json"],
                       before="cp '{connection_file}' /tmp/kernel.json && chmod 0644 /tmp/kernel.json",
                       log=log)
    folder = folder / "kernels" / SPEC
    folder.mkdir(parents=True, exist_ok=True)
    # Interrupts by message: a signal to the sandbox's outer process would end the sandbox, where
    # nbgrader's interrupt at a cell's time limit must reach IPython inside it (ipykernel then
    # signals its own process group).
    (folder / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "lab sandbox",
                                                    "language": "python", "interrupt_mode": "message"}))


def settings(run: Path, connection: Path) -> dict[str, object]:
    """nbgrader's settings for the kernel of :func:`spec`, which binds its channels in ``run`` (the
    sandbox's folder, :data:`SOCKETS` as the kernel sees it) and reads its connection file from
    ``connection`` (root's, read-only in the sandbox)."""
    return {"Execute__kernel_name": SPEC, "BoundedExecute__pinned_channels": True, "KernelManager__transport": "ipc",
            "KernelManager__ip": str(SOCKETS / "kernel"), "PinnedKernelManager__run": str(run),
            "KernelManager__connection_file": str(connection / "kernel.json")}


def output(config) -> Path | None:
    """Where the kernel an app configured with :func:`settings` writes its own output (None for
    an app that runs no sandboxed kernel): read it with :func:`.boundary.read`, never by path."""
    run = config.PinnedKernelManager.get("run") if "PinnedKernelManager" in config else None
    return Path(run) / LOG if run else None


class PinnedKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager for a sandboxed kernel: its channels reached through root's
    descriptors of the sockets it bound, not through their paths (see the module's docstring)."""

    startup_s = Float(60.0, config=True, help="how long the kernel may take to bind its channels "
                                               "(nbclient's startup_timeout, its default)")
    run = Unicode("", config=True, help="the kernel's run folder as root sees it, where its channels "
                                        "are (KernelManager.ip names them as the kernel sees them); "
                                        "empty: the folder KernelManager.ip names")

    _kernel_ip: str | None = None  # where the kernel binds (KernelManager.ip, as configured)
    _links: str | None = None  # root's folder of links, while the kernel runs
    _held: list[int] | None = None  # the descriptors the links lead to

    async def _async_pre_start_kernel(self, **kw):
        self._unpin()
        if self._kernel_ip is None:
            self._kernel_ip = self.ip
        self.ip = self._kernel_ip  # the connection file names the kernel's own path
        for name, port in PORTS.items():
            setattr(self, name, port)
        return await super()._async_pre_start_kernel(**kw)

    async def _async_launch_kernel(self, kernel_cmd, **kw) -> None:
        await super()._async_launch_kernel(kernel_cmd, **kw)
        try:
            self.ip = await self._pin()
        except BaseException:
            await self._async_kill_kernel()
            self._unpin()
            raise

    async def _pin(self) -> str:
        """Wait for the kernel's five sockets, hold them, and return the ``ip`` root connects to."""
        inside, stem = os.path.split(self._kernel_ip)
        folder = self.run or inside
        uid, deadline = sandbox_users.user(), time.monotonic() + self.startup_s
        held: dict[str, int] = {}
        self._held = []
        while len(held) < len(PORTS):
            for name, port in PORTS.items():
                if name in held:
                    continue
                try:
                    held[name] = boundary.socket_of(Path(folder), f"{stem}-{port}", uid)
                    self._held.append(held[name])
                except FileNotFoundError:
                    continue
                except boundary.Refused as err:
                    raise RuntimeError(f"the kernel's {name.removesuffix('_port')} channel: {err}; the "
                                       "grader connects only to sockets the kernel bound") from None
            if len(held) == len(PORTS):
                break
            code = await self.provisioner.poll()
            if code is not None:
                raise RuntimeError(f"the kernel exited (code {code}) before it opened its channels")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the kernel opened {len(held)} of its {len(PORTS)} channels in "
                                   f"{self.startup_s:.0f} s")
            await asyncio.sleep(POLL_S)
        self._links = tempfile.mkdtemp(prefix="lab-kernel-", dir=LINKS_IN)  # mode 700, root's
        if len(os.path.join(self._links, f"k-{max(PORTS.values())}")) > IPC_PATH_MAX:
            raise RuntimeError(f"the grader's links to the kernel's channels ({self._links}) would pass a Unix "
                               f"socket's {IPC_PATH_MAX} bytes: make /run writable, or set TMPDIR to a short path")
        for name, fd in held.items():
            os.symlink(f"/proc/{os.getpid()}/fd/{fd}", os.path.join(self._links, f"k-{PORTS[name]}"))
        return os.path.join(self._links, "k")

    def cleanup_ipc_files(self) -> None:
        """Nothing by path: the kernel's files go with its run folder, root's links with theirs."""

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        self._unpin()

    def _unpin(self) -> None:
        """Close the descriptors and remove root's links (again: does nothing)."""
        for fd in self._held or ():
            os.close(fd)
        self._held = None
        if self._links:
            shutil.rmtree(self._links, ignore_errors=True)
            self._links = None
