"""Root's side of a sandboxed kernel's channels (autograder/kernel.py): the grader connects to
the sockets the kernel bound, never to whatever the kernel later puts at their paths.

Each test runs a small notebook as grading does (nbgrader's Execute as the grader subclasses it,
the grader's kernel spec and settings, a sandbox of the grader's kind), in seconds. They need root
and bubblewrap (``make test`` installs it).
"""

from __future__ import annotations

import os
import socket
import stat
import tempfile
import threading
import time

import nbformat
import pytest
from traitlets.config import Config

from autograder import autograding, batch, boundary, course, kernel, sandbox, sandbox_users

pytestmark = pytest.mark.skipif(sandbox.problem() is not None,
                                reason=f"no grading sandbox here: {sandbox.problem()}")


def execute(tmp_path, *cells: str, timeout_s: int = 30, links: dict[str, str] | None = None
            ) -> tuple[nbformat.NotebookNode, float, Exception | None]:
    """``cells`` run as a graded notebook's are (submission._grade_in's kernel settings), in a
    sandbox that writes only its run folder (where ``links`` are left: {name: target}); the
    notebook as run, its seconds, and what stopped it (nbgrader then fails that notebook alone)."""
    dirs = batch.Folders(tmp_path / "work")
    dirs.fresh("run", "cwd")
    for name, target in (links or {}).items():
        (dirs.run / name).symlink_to(target)
    dirs.fresh("connection", "jupyter", owned=False)
    dirs.connection.chmod(0o700)
    box = sandbox.Sandbox(writable=(dirs.run, dirs.cwd), readable=(dirs.connection,), budget_s=4 * timeout_s)
    kernel.spec(dirs.jupyter, box, dirs.run / "kernel.log")
    config = Config()
    for key, value in {"Execute__timeout": timeout_s,
                       "Execute__shutdown_kernel": "immediate", **kernel.settings(dirs.run, dirs.connection)}.items():
        section, name = key.split("__")
        config[section][name] = value
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    began, error = time.monotonic(), None
    try:
        with course.environment({"JUPYTER_PATH": str(dirs.jupyter), "JUPYTER_RUNTIME_DIR": str(dirs.run)}):
            nb, _ = autograding.BoundedExecute(config=config).preprocess(nb, {"metadata": {"path": str(dirs.cwd)}})
    except Exception as err:
        error = err
    finally:
        sandbox_users.kill_all()
    return nb, time.monotonic() - began, error


def text(cell) -> str:
    return "".join(o.get("text", "") + o.get("ename", "") for o in cell.outputs)


class Listener:
    """A Unix socket outside any sandbox that logs who connects (uid from SO_PEERCRED) and hangs up."""

    def __init__(self, path):
        self.path, self.uids = str(path), []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o777)
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            self.uids.append(int.from_bytes(creds[4:8], "little"))
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()


# In the kernel: the channel's socket file replaced by a link to the listener, and the
# connections it accepted from the grader shut down, so that the grader connects again (zmq
# reconnects by the path it was given); then ten seconds for it to do so.
RELINK = """
import json, os, socket, time

info = json.load(open("/tmp/kernel.json"))
path = f"{{info['ip']}}-{{info['{channel}_port']}}"
os.unlink(path)
os.symlink({listener!r}, path)
dropped = 0
for fd in os.listdir("/proc/self/fd"):
    try:
        sock = socket.socket(fileno=os.dup(int(fd)))
    except OSError:
        continue
    try:  # a connection the channel accepted: named by the channel's path, and not listening
        if sock.family == socket.AF_UNIX and sock.getsockname() == path and not sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            sock.shutdown(socket.SHUT_RDWR)
            dropped += 1
    except OSError:
        pass
    finally:
        sock.close()
print("dropped", dropped)
time.sleep(10)
"""


@pytest.mark.parametrize("channel", ["hb", "shell"])
def test_a_channel_linked_elsewhere_gets_no_connection_from_the_grader(channel, tmp_path):
    """A kernel that replaces its heartbeat (or shell) socket by a link to a socket outside the
    sandbox, and drops the grader's connection to it, gets no connection from the grader there:
    the grader reconnects to the socket the kernel bound. Its notebook ends within its time."""
    outside = tmp_path / "outside"
    outside.mkdir()
    listener = Listener(outside / "listener.sock")
    try:
        nb, seconds, error = execute(tmp_path, RELINK.format(channel=channel, listener=listener.path),
                                     "print('after', 6 * 7)", timeout_s=30)
    finally:
        listener.close()
    assert listener.uids == [], f"the grader connected to the kernel's link {len(listener.uids)} times (uids {set(listener.uids)})"
    assert "dropped" in text(nb.cells[0]) and "dropped 0" not in text(nb.cells[0]), text(nb.cells[0])
    assert seconds < 3 * 30, seconds
    assert error is None and "after 42" in text(nb.cells[1]), (error, nb.cells[1])


def test_a_cell_at_its_time_limit_is_interrupted_through_roots_channels(tmp_path):
    """interrupt_mode "message": nbgrader's interrupt at a cell's time limit reaches the kernel
    over the control channel root holds, and the next cell runs."""
    nb, seconds, error = execute(tmp_path, "while True:\n    pass", "print('next')", timeout_s=5)
    assert error is None, error
    assert "KeyboardInterrupt" in text(nb.cells[0]) or "CellTimeoutError" in text(nb.cells[0]), nb.cells[0].outputs
    assert "next" in text(nb.cells[1]) and seconds < 60, (nb.cells[1].outputs, seconds)


def test_the_grader_connects_only_to_sockets_the_sandbox_user_bound(tmp_path):
    """boundary.socket_of holds a socket the sandbox user bound, and refuses a link, a file and
    another user's socket at the name, without following or opening any."""
    folder = tmp_path / "run"
    folder.mkdir()
    mine = socket.socket(socket.AF_UNIX)
    mine.bind(str(folder / "kernel-1"))
    os.chown(folder / "kernel-1", sandbox_users.user(), sandbox_users.user(), follow_symlinks=False)
    roots = socket.socket(socket.AF_UNIX)
    roots.bind(str(folder / "kernel-2"))
    (folder / "kernel-3").symlink_to(folder / "kernel-1")
    os.mkfifo(folder / "kernel-4")
    try:
        fd = boundary.socket_of(folder, "kernel-1", sandbox_users.user())
        assert stat.S_ISSOCK(os.fstat(fd).st_mode)
        os.close(fd)
        for name, says in (("kernel-2", "owner 0"), ("kernel-3", "a link"), ("kernel-4", "prw")):
            with pytest.raises(boundary.Refused, match=says):
                boundary.socket_of(folder, name, sandbox_users.user())
        with pytest.raises(FileNotFoundError):
            boundary.socket_of(folder, "kernel-5", sandbox_users.user())
    finally:
        mine.close()
        roots.close()


def test_a_channel_that_is_a_link_when_the_kernel_starts_fails_its_notebook_alone(tmp_path, monkeypatch):
    """A link at a channel's name when the kernel starts (as a sandboxed process could leave one):
    the grader connects neither to it nor through it, stops the kernel, keeps no descriptor or
    link of its own, and the notebook fails with a message that names the channel. Its links go in
    a folder of this test's own: the shared one also holds the links of kernels other tests start
    meanwhile (make test's other worker)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    listener = Listener(outside / "listener.sock")
    mine = tempfile.mkdtemp(prefix="t-", dir=kernel.LINKS_IN)  # short: a link's path holds at most 107 bytes
    monkeypatch.setattr(kernel, "LINKS_IN", mine)
    links = set(os.listdir(kernel.LINKS_IN))
    try:
        nb, seconds, error = execute(tmp_path, "print('never')", timeout_s=10, links={"kernel-5": listener.path})
        time.sleep(2)
    finally:
        listener.close()
    assert listener.uids == [], f"the grader connected to the kernel's link {len(listener.uids)} times"
    assert "the kernel's hb channel: kernel-5 is not a socket the sandbox bound (a link" in str(error), error
    assert nb.cells[0].outputs == [] and seconds < 60, (nb.cells[0].outputs, seconds)
    assert set(os.listdir(kernel.LINKS_IN)) == links == set()
    os.rmdir(mine)
    run = str(tmp_path / "work" / "run")
    held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")]
    assert not [h for h in held if h.startswith(run)], held
