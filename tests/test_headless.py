"""``make run``'s path ends every kernel it starts, with the processes the kernel started, before the
next notebook: on success, on a cell's timeout, on SIGTERM and on Ctrl-C; and prints each
notebook's peak memory beside its time (autograder/headless.py).

The notebooks are tiny ones of a course of their own: each records its kernel's pid and the pids
of the processes it started (a child, a child in a session of its own, a DataLoader worker)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from nbclient.exceptions import CellTimeoutError

from autograder import headless
from autograder.run import run_reference

REPO = Path(__file__).resolve().parent.parent
SLEEPER = 'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]{})'


def _record(pids: Path) -> str:
    """A cell that starts a child, a child in a session of its own and a waiting DataLoader
    worker, and writes their pids and the kernel's (with their start times) to ``pids``."""
    return "\n".join([
        "import json, os, subprocess, sys, psutil",
        "from torch.utils.data import DataLoader",
        "child = " + SLEEPER.format(""),
        "detached = " + SLEEPER.format(", start_new_session=True"),
        "batches = iter(DataLoader(range(4), num_workers=1))",
        "next(batches)",
        "tree = [psutil.Process(), *psutil.Process().children(recursive=True)]",
        f"open({str(pids)!r}, 'w').write(json.dumps([[p.pid, p.create_time()] for p in tree]))",
    ])


def _course(root: Path, notebooks: dict[str, list[str]]) -> Path:
    """A course folder at ``root`` whose masters are ``notebooks`` (name: its code cells)."""
    masters = root / "source" / "lab"
    masters.mkdir(parents=True)
    (root / "nbgrader_config.py").write_text('c = get_config()\nc.CourseDirectory.assignment_id = "lab"\n')
    for name, cells in notebooks.items():
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), masters / name)
    return root


def _recorded(*files: Path) -> list[psutil.Process]:
    """The processes the notebooks recorded in ``files``, those still alive (zombies aside)."""
    alive = []
    for path in files:
        for pid, started in json.loads(path.read_text()):
            try:
                process = psutil.Process(pid)
                if process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except psutil.NoSuchProcess:
                pass
    return alive


@pytest.fixture
def left_alive(tmp_path):
    """``left_alive(*pid files)``: the processes they recorded still alive, described. Those of
    every pid file in ``tmp_path`` are killed at the test's end, so that a failing test leaves none."""
    yield lambda *files: [f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in _recorded(*files)]
    for process in _recorded(*tmp_path.glob("*.json")):
        process.kill()


def test_run_ends_each_kernel_and_its_processes_and_prints_their_peak_memory(tmp_path, left_alive, capsys):
    pids = [tmp_path / "01.json", tmp_path / "02.json"]
    root = _course(tmp_path / "course", {"01_first.ipynb": [_record(pids[0])], "02_second.ipynb": [_record(pids[1])]})
    run_reference(root, tmp_path / "build", timeout_s=300)
    assert left_alive(*pids) == [], "a notebook's kernel or a process it started outlived make run's notebook"
    printed = capsys.readouterr().out
    for name in ("01_first.ipynb", "02_second.ipynb"):
        line = next((line for line in printed.splitlines() if line.startswith(name)), "")
        assert line.endswith(" GiB") and float(line.split()[-2]) > 0.01, f"no peak memory for {name}:\n{printed}"
    assert "the run at its peak" in printed, printed


def test_a_cell_past_its_timeout_ends_the_kernel_and_its_processes(tmp_path, left_alive):
    pids = tmp_path / "01.json"
    root = _course(tmp_path / "course", {"01_slow.ipynb": [_record(pids), "import time\ntime.sleep(60)"]})
    with pytest.raises(CellTimeoutError):
        run_reference(root, tmp_path / "build", timeout_s=10)
    assert left_alive(pids) == []


@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_run_ends_the_kernel_and_its_processes_and_fails(tmp_path, left_alive, sent):
    pids = tmp_path / "01.json"
    root = _course(tmp_path / "course", {"01_slow.ipynb": [_record(pids), "import time\ntime.sleep(600)"]})
    # SIGINT as a terminal's Ctrl-C delivers it (a shell's background job would ignore it)
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from autograder.run import run_reference; from autograder.stopping import Stopped\n"  # as cli.main
            f"try: run_reference({str(root)!r}, {str(tmp_path / 'build')!r})\n"
            "except Stopped as stop: sys.exit(stop.exit_code)")
    run = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not pids.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pids.exists(), f"the notebook did not start its processes:\n{run.communicate(timeout=30)[0][-3000:]}"
        time.sleep(1)  # into the sleeping cell
        run.send_signal(sent)
        out = run.communicate(timeout=60)[0]
    finally:
        run.kill()
        run.wait()
    assert run.returncode == 128 + sent, f"run stopped by {sent.name} exited {run.returncode}:\n{out[-3000:]}"
    assert left_alive(pids) == [], f"{sent.name} left the kernel's processes alive:\n{out[-3000:]}"


def test_the_peak_counts_the_processes_below_the_root(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; b = b\"x\" * (200 * 2**20); time.sleep(60)"])
    try:
        time.sleep(1.5)
        with headless.TreePeak(os.getpid()) as tree, headless.TreePeak(child.pid) as alone:
            time.sleep(0.2)
        assert alone.peak_bytes > 200 * 2**20
        assert tree.peak_bytes > alone.peak_bytes + psutil.Process().memory_info().rss // 2
    finally:
        child.kill()
        child.wait()
