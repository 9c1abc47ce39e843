"""The judge (labsupport/grading/judging.py): 01-07's verdicts decided by a process that runs no
student code, driving the student's carried code in a worker and the baseline in another (01 has
none: what its checks compare with, the judge measures itself).

Each submission here is carried code as a careless or clever student writes it, handed to the
judge exactly as the grader hands it (``inputs/code/NN.pkl``, kept from a kernel's cells by
:func:`carried`; for 06 the rungs and the
report), at the tiny profile; where speed
matters, at ``tiny:grades_speed=1``. The sandboxed cases need root and bubblewrap (``make test``
installs it) and skip visibly without them; those that grade speed need cgroup v2 groups (root),
where the judge freezes one worker while it times the other, and skip visibly without them (a
judge with none grades no speed comparing two sides: those checks are "not measured").
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import sys
import time
from pathlib import Path

import pytest
import torch

from autograder import sandbox, sandbox_users, verdicts
from labsupport.grading import cgroups, judging, wire
from labsupport.hardware import describe_machine

ROOT = Path(__file__).resolve().parent.parent
needs_sandbox = pytest.mark.skipif(sandbox.problem() is not None,
                                   reason=f"no grading sandbox here: {sandbox.problem()}")
needs_cgroups = pytest.mark.skipif(cgroups.problem() is not None,
                                   reason=f"no cgroup v2 groups here: {cgroups.problem()}")


@pytest.fixture(scope="module")
def reference_code() -> dict[str, str]:
    """The reference's solution cells of every notebook, as a kernel runs them (:func:`carried`
    turns them into the carried code the grader hands over)."""
    import nbformat

    from autograder import course
    from labsupport import notebooks

    out = {}
    for master in course.graded_masters():
        ids = notebooks.get(master.name[:2]).graded
        cells = [c.source for c in nbformat.read(master, as_version=4).cells
                 if c.cell_type == "code" and c.get("id") in ids and c.metadata.get("nbgrader", {}).get("solution")]
        out[master.name[:2]] = "\n\n\n".join(cells) + "\n"
    return out


# A kernel's cells, carried: run as a notebook's cells (after its setup cell's names), then kept by
# carry.keep, in a process of their own. So that code which bends the lab as it loads is still
# tested, the pickle also runs the cells' text again as it loads, before the functions (what a
# hand-made NN.pkl can do: unpickling runs code, which is why only the sandboxed worker loads it).
KERNEL = """
import json, linecache, sys
from pathlib import Path
import pandas as pd, torch
import labsupport as ls
from labsupport import carry, grading, notebooks

class RunsOnLoad:
    def __init__(self, text):
        self.text = text
    def __reduce__(self):
        return exec, (self.text, {"__name__": "carried", "ls": ls, "torch": torch, "F": torch.nn.functional,
                                  "pd": pd, "lab": LAB})

LAB = grading.grading_lab()
for number, text, dest in json.loads(sys.argv[1]):
    space = {"__name__": "__main__", "ls": ls, "torch": torch, "F": torch.nn.functional, "pd": pd, "lab": LAB}
    linecache.cache[f"<cell {number}>"] = (len(text), None, text.splitlines(True), f"<cell {number}>")
    exec(compile(text, f"<cell {number}>", "exec"), space)
    carry.keep(number, space, Path(dest).parent)
    functions = {n: space[n] for n in notebooks.get(number).graded if n in space}
    Path(dest).write_bytes(carry._dumps({"notebook": number, "on_load": RunsOnLoad(text), "functions": functions}))
"""


def carried(texts: dict[str, str], folder: Path) -> None:
    """Each ``{number: cells' text}`` carried into ``folder/NN.pkl``, as a kernel's checks keep it."""
    folder.mkdir(parents=True, exist_ok=True)
    if not texts:
        return
    jobs = [(n, text, str(folder / f"{n}.pkl")) for n, text in texts.items()]
    # Its output into a file, not a pipe: code that starts processes as it runs (the burners below)
    # would hold a pipe open, and the run would wait for them; so it ends, is reaped, and they see it gone.
    with tempfile.TemporaryFile("w+") as log:
        done = subprocess.run([sys.executable, "-c", KERNEL, json.dumps(jobs)], stdout=log, stderr=log, text=True,
                              timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "LAB_PROFILE": "tiny"})
        log.seek(0)
        assert done.returncode == 0, log.read()[-3000:]


@pytest.fixture(scope="module")
def reference_02(reference_code) -> str:
    return reference_code["02"]


def judge(tmp_path, tiny_data, code: str | None, *, notebook: str = "02", earlier: dict[str, str] | None = None,
          profile: str = "tiny", boxed: bool = False, reply_timeout_s: float | None = None,
          thresholds: Path | None = None, prefix: list[str] | None = None, ladder: bool = False,
          kept: dict[str, bytes] | None = None) -> dict:
    """Run the judge on ``code`` as notebook ``notebook``'s carried code (``earlier``: earlier
    notebooks' carried code, as the grader hands it over); its verdict. ``ladder``: hand it what
    06 reads as the grader would, every rung recorded on this machine and an exported report.
    ``kept``: carried files as a kernel kept them (``{number: NN.pkl's bytes}``), handed over as they are."""
    inputs, judged = tmp_path / "inputs", tmp_path / "judged"
    (inputs / "code").mkdir(parents=True)
    judged.mkdir()
    if ladder:
        from labsupport import notebooks, results

        for n, nb in enumerate(notebooks.rungs(), start=1):  # 01, 04 as the store held them; the rest the judges'
            folder = inputs / "rungs" if nb.number in ("01", "04") else judged
            results.record(nb.stage, {"samples_per_s": 10.0 * n}, directory=folder)
        (inputs / "report.html").write_text('<table class="dataframe machine"></table><table class="dataframe '
                                            'ladder"></table><img src="data:image/png;base64,AAAA">')
    carried({**(earlier or {}), **({notebook: code} if code is not None else {})}, inputs / "code")  # None: nothing
    for number, data in (kept or {}).items():
        (inputs / "code" / f"{number}.pkl").write_bytes(data)
    for path in (tmp_path, *tmp_path.parents):  # the sandbox user reads the inputs
        if path != Path("/"):
            path.chmod(path.stat().st_mode | 0o055)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    prefix, groups, grouped = prefix or [], {}, {}
    if boxed:  # as the grader boxes a judge's workers: each in its sandbox, joining a cgroup of its own
        # The interpreter's environment too, where it is not below the checkout (a worktree's linked .venv)
        venv = Path(sys.prefix).resolve()
        readable = (ROOT, Path(tiny_data), inputs) + (() if venv.is_relative_to(ROOT) else (venv,))
        box = sandbox.Sandbox(writable=(), readable=readable)
        prefix = box.command([], cwd=Path("/tmp"))
        groups, grouped = verdicts.worker_groups(notebook, box, [])
    spec = {"notebook": notebook, "profile": profile,
            "thresholds": str(thresholds or ROOT / "labsupport" / "thresholds.toml"),
            "calibration": None, "data": str(tiny_data), "inputs": str(inputs), "judged": str(judged),
            "out": str(tmp_path / "verdict.json"), "sandbox": prefix, "env": env,
            "reply_timeout_s": reply_timeout_s, **grouped}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    try:
        done = subprocess.run([sys.executable, "-P", "-m", "labsupport.grading.judging", str(tmp_path / "spec.json")],
                              env={**env, "OMP_WAIT_POLICY": "PASSIVE"}, capture_output=True, text=True, timeout=600)
    finally:
        for group in groups.values():
            assert group.remove(), f"the judge's {group.path} could not be emptied and removed"
    if boxed:
        sandbox_users.kill_all()
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((tmp_path / "verdict.json").read_text())


def statuses(verdict: dict) -> dict[str, str]:
    return {c: v["status"] for c, v in verdict["checks"].items()}


def assert_caught_patching(verdict: dict, *names: str) -> None:
    """Carried code that replaced ``names`` in its worker as it loaded: the worker's guard put them
    back and named them, and every check of the notebook fails with that note, unmeasured."""
    assert all(v["status"] == "fail" and v["reason"] == "error" and "when it was loaded" in v["note"]
               for v in verdict["checks"].values()), verdict["checks"]
    assert any(all(n in p for n in names) and "when it was loaded" in p for p in verdict["problems"]), verdict


# A module-level helper class, as many students write it: carried and run as written.
HELPER_CLASS = '''

class _Batches:
    def __init__(self, loader):
        self.loader = loader

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        yield from self.loader


_made_here = make_fast_loader


def make_fast_loader(lab, split="train", augment=True):
    return _Batches(_made_here(lab, split, augment))
'''


def test_reference_and_a_helper_class_are_judged_correct(tmp_path, tiny_data, reference_02):
    verdict = judge(tmp_path, tiny_data, reference_02 + HELPER_CLASS)
    assert statuses(verdict) == {"02-loader-speedup": "n/a", "02-data-wait-share": "n/a"}, verdict
    assert verdict["judge"] and not verdict["problems"] and verdict["rung"] > 0
    # each batch's crossing from its worker, measured apart, is taken off both sides' waits
    assert "crossing to the grader" in verdict["checks"]["02-data-wait-share"]["note"], verdict["checks"]
    # what later notebooks' verdicts read: this notebook's code, checks table and rung, in root's folder
    judged = tmp_path / "judged"
    assert (judged / "code" / "02.pkl").read_bytes() == (tmp_path / "inputs" / "code" / "02.pkl").read_bytes()
    assert (judged / "checks" / "02.json").is_file() and (judged / "02-data.json").is_file()


# Carried code that, when it is loaded, bends what measures it: the naive loader and PIL slowed,
# labsupport's judge and comparison replaced. In the verdict process all of it ran beside the
# baseline; in its worker it reaches nothing the judge measures or decides with, and the worker's
# guard names what it replaced.
BENDING = '''
import time as _time
import PIL.Image as _Image
import labsupport.grading as _grading
import labsupport.measure as _measure

_open = _Image.open


def _slow_open(*args, **kwargs):
    _time.sleep(0.05)
    return _open(*args, **kwargs)


_Image.open = _slow_open
ls.pipeline.naive_loader = lambda *a, **k: (_time.sleep(1), None)[1]
_grading.judge = lambda check, measured, machine, **kw: None
_measure.compare = None


def make_fast_loader(lab, split="train", augment=True):
    return _naive(lab.profile, split=split, augment=augment, seed=lab.seed)
'''


@needs_cgroups  # its plain half grades 02's speed, which a judge with no cgroup does not (it is "not measured")
def test_code_that_bends_the_baseline_or_the_judge_when_loaded_earns_nothing(tmp_path, tiny_data):
    """The naive loader as the answer, with the baseline slowed and the judge replaced as it loads:
    caught replacing them, every check fails. Its loader alone, without the bending, is measured
    as the naive loader it is (about 1x), and fails below the bar."""
    naive = "import labsupport as ls\n_naive = ls.pipeline.naive_loader\n"
    verdict = judge(tmp_path / "bent", tiny_data, naive + BENDING, profile="tiny:grades_speed=1")
    assert_caught_patching(verdict, "PIL.Image.open", "labsupport.pipeline.naive_loader")
    plain = naive + BENDING[BENDING.index("\ndef make_fast_loader"):]
    verdict = judge(tmp_path / "plain", tiny_data, plain, profile="tiny:grades_speed=1")
    speedup = verdict["checks"]["02-loader-speedup"]
    assert speedup["status"] == "fail" and speedup["reason"] == "below bar", speedup
    # The naive loader against itself: about 1x, but at the tiny profile beside make test's other
    # lanes one run read 1.68x (and the instructor tests note tiny-profile speedups varying 3x between
    # runs); what matters is that it stays well under the bar, as measured here.
    assert speedup["measured"] < 2.5, speedup


# The paused side keeps running (issue 60). The naive loader served as the answer, with processes
# of its own that slow the baseline while the student's worker is stopped, which a SIGSTOP to the
# pids listed in /proc once does not stop. Each burns CPU only while the worker is stopped.
CHEATS = {
    # A process that forks and lets its parent exit every millisecond (never the pid just listed),
    # and starts burners in sessions of their own when it sees its worker stopped.
    "pid hopper, setsid burners": """
import os as _os, time as _time

_worker = _os.getpid()


def _stopped():
    try:
        with open(f"/proc/{_worker}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        _os._exit(0)  # the worker is gone: so are we


def _hop():
    while True:
        if _os.fork():
            _os._exit(0)
        if _stopped():
            for _ in range(3):
                if _os.fork() == 0:
                    _os.setsid()
                    while _stopped():
                        pass
                    _os._exit(0)
            while _stopped():
                _time.sleep(0.001)
        _time.sleep(0.001)


if _os.fork() == 0:
    _os.setsid()
    _hop()
""",
    # Burners started as the code loads, before the first pause, handed to init (a double fork):
    # no longer below the worker when its processes are listed.
    "burners started before the first pause": """
import os as _os, time as _time

_worker = _os.getpid()


def _stopped():
    try:
        with open(f"/proc/{_worker}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        _os._exit(0)


for _ in range(3):
    if _os.fork() == 0:
        _os.setsid()
        if _os.fork():
            _os._exit(0)
        while True:
            if not _stopped():
                _time.sleep(0.001)
""",
}
NAIVE_ANSWER = """import labsupport as ls
_naive = ls.pipeline.naive_loader


def make_fast_loader(lab, split="train", augment=True):
    return _naive(lab.profile, split=split, augment=augment, seed=lab.seed)
"""


@needs_cgroups
@pytest.mark.parametrize("cheat,boxed", [(c, False) for c in sorted(CHEATS)] + [
    pytest.param("pid hopper, setsid burners", True, marks=needs_sandbox, id="pid hopper, sandboxed")])
def test_processes_that_run_on_while_their_worker_is_stopped_gain_nothing(tmp_path, tiny_data, cheat, boxed):
    """The naive loader as 02's answer, with processes that slow the baseline while the student's
    worker is stopped: each worker in a cgroup frozen as a whole, they are frozen with it, and the
    answer measures as the naive loader it is (about 1x: both checks below their bars, as without
    them: 0.76x and 0.78x here, its wait 23.7 and 26.4 ms against the naive loader's 21.0 and
    20.8). With a SIGSTOP to the pids listed in /proc (the old pause) they ran: the hopper measured
    1.82x, and the early burners slowed the naive loader's wait to 30.5 ms against the answer's
    11.6 ms, passing 02's data-wait check (tiny:grades_speed=1, 2 busy cores; at the real profile
    issue 60 measured 29x, 5.81x and 3.21x)."""
    verdict = judge(tmp_path, tiny_data, NAIVE_ANSWER + CHEATS[cheat], profile="tiny:grades_speed=1", boxed=boxed)
    speedup, wait = verdict["checks"]["02-loader-speedup"], verdict["checks"]["02-data-wait-share"]
    print(f"{cheat}: speedup {speedup['measured']}, {speedup['note'][:160]}; wait: {wait['note'][:200]}; "
          f"frozen side's CPU per block: {verdict.get('frozen_cpu_usec')}; problems: {verdict['problems']}")
    assert speedup["status"] == "fail" and speedup["reason"] == "below bar", speedup
    # The naive loader against itself, as in test_code_that_bends_...: about 1x idle, but beside make
    # test's other lanes at the tiny profile one run read 1.63x (the early burners, frozen; /tmp/ci4)
    # and another 1.68x. So this bound only keeps it well under the bar of 3; what tells the freeze
    # from the old pause (the hopper's 1.82x) is the frozen side's CPU per block, verified below,
    # and the wait check.
    assert speedup["measured"] < 2.5, speedup
    assert wait["status"] == "fail" and wait["reason"] == "below bar", wait  # its wait fell against nothing
    frozen = verdict.get("frozen_cpu_usec") or {}
    assert frozen.get("blocks") and frozen["max"] <= judging.PAUSED_CPU_USEC, verdict  # every block verified
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _runs(p, str(tmp_path).encode())], \
        "every process of the workers ended with the judge"


@needs_cgroups
def test_a_worker_frozen_as_a_group_uses_no_cpu_where_sigstop_by_pid_list_let_its_processes_run(tmp_path, tiny_data):
    """The pid hopper's worker, paused as the judge paused it before issue 60 (SIGSTOP to the pids
    listed in /proc: a Worker given no group) and as it does now (its group frozen): its group's CPU
    time over each 0.2 s pause. Stopped by signal, its burners ran (38-95 ms of CPU per pause on 2
    busy cores); frozen, nothing did (0 us in every pause)."""
    inputs = tmp_path / "inputs"
    carried({"02": NAIVE_ANSWER + CHEATS["pid hopper, setsid burners"]}, inputs / "code")
    group = cgroups.Group.make(cgroups.mount() / f"lab-test-{os.getpid()}-{tmp_path.name[-12:]}")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    spec = {"notebook": "02", "profile": "tiny", "data": str(tiny_data), "inputs": str(inputs)}
    used: dict[str, list[int]] = {"SIGSTOP": [], "freeze": []}
    try:
        with judging.Worker("student", spec, prefix=group.join_command(), env=env, buffer_bytes=2**20) as worker:
            worker.request("load")
            for way, pause in (("SIGSTOP", worker.pause), ("freeze", group.freeze)):
                for _ in range(5):
                    pause(True)
                    before = group.cpu_usec()
                    time.sleep(0.2)
                    used[way].append(group.cpu_usec() - before)
                    pause(False)
                    time.sleep(0.05)
    finally:
        assert group.remove()
    print(f"the paused worker's group used, per 0.2 s pause (us): {used}")
    assert min(used["SIGSTOP"]) > 10_000, used  # its burners ran while it was "stopped"
    assert max(used["freeze"]) <= judging.PAUSED_CPU_USEC, used


def _runs(pid: str, what: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return what in f.read()
    except OSError:
        return False


@pytest.mark.long  # a machine without a cgroup the grader may freeze: other ground (29 s in ci5)
def test_without_a_group_to_freeze_a_side_in_the_judge_grades_no_speed_that_compares_two_sides(tmp_path, tiny_data,
                                                                                                   reference_02):
    """Workers under a sandbox prefix the grader gave no cgroup (as where none can be had: no root,
    no cgroup v2): the judge cannot freeze one side while it times the other, so the reference's 02
    speed checks fail "not measured", saying why, rather than being graded unprotected; at the
    tiny profile, which grades no speed, they stay n/a."""
    verdict = judge(tmp_path / "speed", tiny_data, reference_02, profile="tiny:grades_speed=1", prefix=["env"])
    for check in ("02-loader-speedup", "02-data-wait-share"):
        v = verdict["checks"][check]
        assert v["status"] == "fail" and v["reason"] == "not measured" and "could not freeze" in v["note"], v
        assert "no cgroup" in v["note"], v
    assert any("speed not graded" in p for p in verdict["problems"]), verdict
    verdict = judge(tmp_path / "tiny", tiny_data, reference_02, prefix=["env"])
    assert statuses(verdict) == {"02-loader-speedup": "n/a", "02-data-wait-share": "n/a"}, verdict


def test_a_loader_honest_for_one_epoch_then_repeating_a_batch_forever_fails(tmp_path, tiny_data, reference_02):
    code = reference_02 + '''

_honest = make_fast_loader


def make_fast_loader(lab, split="train", augment=True):
    loader = _honest(lab, split, augment)

    class OnceThenOne:
        epochs = 0

        def __len__(self):
            return len(loader)

        def __iter__(self):
            OnceThenOne.epochs += 1
            if OnceThenOne.epochs == 1 or split != "train":
                yield from loader
                return
            batch = next(iter(loader))
            while True:  # the second epoch never ends
                yield batch
    return OnceThenOne()
'''
    verdict = judge(tmp_path, tiny_data, code)
    for c, v in verdict["checks"].items():
        assert v["status"] == "fail" and v["reason"] == "incorrect" and "timed epoch" in v["note"], (c, v)


def test_a_worker_that_breaks_its_channel_costs_its_own_checks(tmp_path, tiny_data, reference_02):
    """Carried code that writes garbage into the reply channel, then a loader that kills its
    worker: each check fails with what happened, and the judge still writes its verdict."""
    code = reference_02 + '''

import os as _os


def make_fast_loader(lab, split="train", augment=True):
    for fd in range(3, 12):  # whatever the channel is: an enormous announced message
        try:
            _os.write(fd, b"\\xff\\xff\\xff\\xff" + b"x" * 64)
        except OSError:
            pass
    _os._exit(3)
'''
    verdict = judge(tmp_path, tiny_data, code)
    for c, v in verdict["checks"].items():
        assert v["status"] == "fail" and ("broke off" in v["note"] or "announced" in v["note"]), (c, v)


def test_a_loader_that_never_answers_fails_in_its_time(tmp_path, tiny_data, reference_02):
    """A loader whose first batch never comes: each check fails saying the worker did not answer in
    time, and the judge neither waits on it again nor pairs a late reply with a later request."""
    code = reference_02 + '''

import time as _time


def make_fast_loader(lab, split="train", augment=True):
    class Hung:
        def __len__(self):
            return 5

        def __iter__(self):
            _time.sleep(3600)
            yield None
    return Hung()
'''
    verdict = judge(tmp_path, tiny_data, code, reply_timeout_s=5)
    for c, v in verdict["checks"].items():
        assert v["status"] == "fail" and "within 5 s" in v["note"], (c, v)
    assert verdict["seconds"] < 60, verdict


@needs_sandbox
def test_in_the_sandbox_the_worker_reaches_neither_the_judge_nor_its_files(tmp_path, tiny_data, reference_02):
    """Sandboxed, the student's worker runs as the sandbox user, sees no process of the judge's and
    cannot write where the judge keeps what it decided; the reference is still judged correct. Its
    heap is steady before the student's code runs (measure.steady_heap: a 20 MiB block comes from
    the heap, not a fresh mapping)."""
    judged = tmp_path / "judged"
    # Probed where the code runs, at its first call (what a kernel computed at module level is
    # carried as the kernel's value).
    code = reference_02 + f'''

def _probe(_seen={{}}):
    import ctypes as _ctypes
    import os as _os
    from pathlib import Path as _Path

    if _seen:
        return _seen
    _seen.update({{"uid": _os.getuid(), "pids": sorted(int(p) for p in _os.listdir("/proc") if p.isdigit())}})
    _libc = _ctypes.CDLL(None)
    _libc.malloc.restype = _ctypes.c_void_p
    _block = _libc.malloc(20 * 2**20)
    _seen["heap"] = any(line.rstrip().endswith("[heap]") and int(line.split("-")[0], 16) <= _block
                        < int(line.split()[0].split("-")[1], 16) for line in open("/proc/self/maps"))
    try:
        (_Path({str(judged)!r}) / "02-data.json").write_text("forged")
        _seen["wrote"] = True
    except OSError:
        _seen["wrote"] = False
    return _seen


_honest_make = make_fast_loader


def make_fast_loader(lab, split="train", augment=True):
    _seen = _probe()
    if _seen["uid"] == 0 or _seen["wrote"] or max(_seen["pids"]) > 100 or not _seen["heap"]:
        raise RuntimeError(f"not the sandbox the judge set up: {{_seen}}")
    return _honest_make(lab, split, augment)
'''
    verdict = judge(tmp_path, tiny_data, code, boxed=True)
    assert statuses(verdict) == {"02-loader-speedup": "n/a", "02-data-wait-share": "n/a"}, verdict
    assert json.loads((judged / "02-data.json").read_text())["stage"] == "02-data"


# --- the wire ------------------------------------------------------------------------------------

# 05 as a student writes it, compiled with Dynamo's eager backend (a graph captured in seconds,
# where Inductor would take minutes at this size): correct, and about as fast as eager.
COMPILE_05 = """
import math

import torch


def compile_inference(model):
    return torch.compile(model, backend="eager")


def break_even_steps(compile_s, eager_ms, compiled_ms):
    return math.inf if compiled_ms >= eager_ms else compile_s * 1000 / (eager_ms - compiled_ms)


def attention(q, k, v, causal=False):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
"""


def test_05_correct_code_is_judged_correct_in_its_worker(tmp_path, tiny_data, reference_code):
    """Compiled, with outputs equal to eager's on every timed call, and the break-even right on the
    compile time the judge measured; inferring in the student's carried 03 precision. Without their
    02 code the rung cannot be set up, and the verdict says so."""
    verdict = judge(tmp_path, tiny_data, COMPILE_05, notebook="05", earlier={"03": reference_code["03"]})
    checks = verdict["checks"]
    assert statuses(verdict) == {"05-compile-speedup": "n/a", "05-break-even": "pass", "05-attention": "pass"}, checks
    assert "read from outside" in checks["05-attention"]["note"], checks["05-attention"]
    note = checks["05-compile-speedup"]["note"]
    assert "every timed call (fresh input each) within" in note and "(your 03 choice)" in note, note
    assert any("rung not measured" in p and "02" in p for p in verdict["problems"]), verdict["problems"]


def test_05_break_even_finds_no_checker_to_read_in_its_worker_and_written_out_scores_show_outside(tmp_path, tiny_data):
    """A break_even_steps that searches every frame above it for the checker's numbers: in its
    worker there is no checker to read, and its answers are wrong. And an attention that is right
    but writes out the L x L scores with its allocations hidden from torch's own counts (numpy):
    the worker's memory, read from outside, shows them, and it fails that check alone."""
    code = COMPILE_05 + """

import sys
import time

import numpy as np


def attention(q, k, v, causal=False):
    q64, k64, v64 = (t.double().numpy() for t in (q, k, v))
    scores = q64 @ k64.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        scores = np.where(np.triu(np.ones(scores.shape[-2:], dtype=bool), 1), -np.inf, scores)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return torch.from_numpy(weights / weights.sum(-1, keepdims=True) @ v64).float()


def break_even_steps(compile_s, eager_ms, compiled_ms):
    frame = sys._getframe(1)
    while frame is not None:
        for name in ("want", "expected", "compile_s"):
            if isinstance(frame.f_locals.get(name), float):
                return frame.f_locals[name]
        frame = frame.f_back
    return -1.0
"""
    verdict = judge(tmp_path, tiny_data, code, notebook="05")
    even = verdict["checks"]["05-break-even"]
    assert even["status"] == "fail" and "expected" in even["note"], even
    held = verdict["checks"]["05-attention"]
    assert held["status"] == "fail" and "read from outside" in held["note"] and "scores" in held["note"], held


def test_05_a_compiled_model_that_remembers_its_first_answer_fails(tmp_path, tiny_data):
    """compile_inference that compiles, then answers every later call of the same shape with its
    first call's logits (as fast as it gets): each timed call gets fresh input, so the remembered
    answers differ from eager's, and the check fails."""
    code = COMPILE_05 + """

def compile_inference(model):
    compiled = torch.compile(model, backend="eager")
    remembered = {}

    def call(images):
        key = tuple(images.shape)
        if key not in remembered:
            remembered[key] = compiled(images)
        return remembered[key]
    return call
"""
    verdict = judge(tmp_path, tiny_data, code, notebook="05")
    speedup = verdict["checks"]["05-compile-speedup"]
    assert speedup["status"] == "fail" and "differ from eager" in speedup["note"], speedup


def test_05_code_that_slows_the_eager_baseline_when_loaded_earns_nothing(tmp_path, tiny_data):
    """Carried code that, as it loads, makes labsupport's eager model sleep on every call: in one
    process it would slow the baseline it is compared with. The baseline's worker never loads it,
    and the student's worker's guard names it: every check fails (05's bar set for class cpu here,
    where the course grades no compile speed)."""
    code = COMPILE_05 + """

import time

from labsupport.grading import g05_compile

_call = g05_compile.Inference.__call__


def _slow_when_eager(self, *args):
    if self.fn is self.model:
        time.sleep(0.05)
    return _call(self, *args)


g05_compile.Inference.__call__ = _slow_when_eager
"""
    text = (ROOT / "labsupport" / "thresholds.toml").read_text()
    section = text.index('[checks."05-compile-speedup"]')
    cpu = text.index('cpu = "n/a"', section)
    thresholds = tmp_path / "thresholds.toml"
    thresholds.write_text(text[:cpu] + "cpu = 1.25" + text[cpu + len('cpu = "n/a"'):])
    verdict = judge(tmp_path, tiny_data, code, notebook="05", profile="tiny:grades_speed=1", thresholds=thresholds)
    assert_caught_patching(verdict, "Inference.__call__")


# 03's helpers as many students write them: a class and a module-level constant beside the graded
# functions, and the graded step calling them.
HELPERS_03 = """

LOSS_SCALE_NOTE = "float16 needs the scaler; bfloat16 does not"


class _Timer:
    def __init__(self):
        self.calls = 0

    def tick(self):
        self.calls += 1


_timer = _Timer()
_amp_step = amp_train_step


def amp_train_step(model, optimizer, scaler, images, labels, dtype):
    _timer.tick()
    return _amp_step(model, optimizer, scaler, images, labels, dtype)
"""


# On class cpu the lab trains in float32 and 03's activation saving is n/a; where 16 bits train
# (AMX, AVX-512 BF16, GPUs) the tiny profile grades it, and the reference's passes.
SAVING_03 = "n/a" if describe_machine().device_class == "cpu" else "pass"


def test_03_reference_with_helpers_is_judged_correct_in_its_worker(tmp_path, tiny_data, reference_code):
    """03 decided by the judge: the reference's step with a helper class and a constant beside it,
    run in its worker; every check as the self-check gives it, and the rung (their 02 loader
    feeding their 03 step, in their worker) timed from the judge."""
    verdict = judge(tmp_path, tiny_data, reference_code["03"] + HELPERS_03, notebook="03",
                    earlier={"02": reference_code["02"]})
    assert verdict["judge"] and not verdict["problems"], verdict
    assert statuses(verdict) == {"03-amp-speedup": "n/a", "03-activation-ratio": SAVING_03,
                                 "03-accuracy-gap": "n/a", "03-fp16-scaler": "pass"}, verdict["checks"]
    assert verdict["rung"] > 0, verdict
    rung = json.loads((tmp_path / "judged" / "03-amp.json").read_text())["metrics"]
    assert rung["timed_by"] == "the grader's judge, from outside" and rung["phases_ms"]["data wait"] > 0, rung


def test_03_a_step_that_does_less_after_its_first_calls_loses_the_speed_check_only(tmp_path, tiny_data,
                                                                                   reference_code):
    """A step honest for its first calls, then training only the classifier (as a step that counts
    its calls does): each timed call's update is read at positions the judge draws after the call
    returned, so it fails the speed check as incorrect, and nothing else. (The step that finds the
    judge's timed call on its worker's stack is the shortcuts scenario's 03, graded through the
    judge in tests/test_instructor.py.)"""
    code = reference_code["03"] + """

_honest = amp_train_step


def amp_train_step(model, optimizer, scaler, images, labels, dtype):
    model._calls = getattr(model, "_calls", 0) + 1
    if model._calls > 3:  # past the checks' first calls: only the classifier learns
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("fc."))
    return _honest(model, optimizer, scaler, images, labels, dtype)
"""
    verdict = judge(tmp_path, tiny_data, code, notebook="03")
    speed = verdict["checks"]["03-amp-speedup"]
    assert speed["status"] == "fail" and speed["reason"] == "incorrect" and "timed call" in speed["note"], speed
    assert statuses(verdict) == {"03-amp-speedup": "fail", "03-activation-ratio": SAVING_03,
                                 "03-accuracy-gap": "n/a", "03-fp16-scaler": "pass"}, verdict["checks"]


def test_03_code_that_slows_the_fp32_baseline_when_loaded_earns_nothing(tmp_path, tiny_data, reference_code):
    """Carried code that, as it loads, makes the lab's own fp32 update sleep: in one process it
    slowed the baseline it is compared with (2.3x at this profile, class cpu). The baseline's
    worker never loads it, and the student's worker's guard names it: every check fails."""
    code = reference_code["03"] + """

import time

from labsupport import train


def choose_precision(machine):  # float32 on every CPU kind: both sides the same arithmetic, about 1x
    return {"dtype": None, "channels_last": False}

_fp32 = train.TrainStep.__call__


def _slow_fp32(self, images, labels, clock=None):
    if self.update is None:
        time.sleep(0.2)
    return _fp32(self, images, labels, clock)


train.TrainStep.__call__ = _slow_fp32
"""
    verdict = judge(tmp_path, tiny_data, code, notebook="03")
    assert_caught_patching(verdict, "TrainStep.__call__")


def test_a_notebook_that_carried_nothing_fails_every_check_without_starting_a_worker(tmp_path, tiny_data):
    """The untouched release's 03 carries no code: every check fails on the missing function, and
    the judge starts no worker for it (a blank notebook costs the batch one process, not three)."""
    # a worker would start under /bin/false, and break off at once: a problem in the verdict
    verdict = judge(tmp_path, tiny_data, None, notebook="03", prefix=["/bin/false"])
    assert set(statuses(verdict).values()) == {"fail"}, verdict
    assert all("is not defined" in c["note"] for c in verdict["checks"].values()), verdict["checks"]
    assert verdict["rung"] is None and not verdict["problems"], verdict


def test_the_wire_round_trips_tensors_and_refuses_what_lies_outside_its_buffer():
    fd, mapped = wire.buffer(4096)
    view = memoryview(mapped)
    try:
        x, y = torch.arange(12, dtype=torch.float32).reshape(3, 4), torch.tensor([1, 2, 3])
        got = wire.take(view, wire.put(view, [x, y]))
        assert torch.equal(got[0], x) and torch.equal(got[1], y)
        for bad, why in (([{"dtype": "float32", "shape": [4096], "offset": 0}], "outside"),
                         ([{"dtype": "float32", "shape": [2], "offset": 4095}], "outside"),
                         ([{"dtype": "object", "shape": [1], "offset": 0}], "dtypes"),
                         ([{"dtype": "float32", "shape": [-1], "offset": 0}], "shape"),
                         ([{"dtype": "float32", "shape": [1], "offset": True}], "shape"),
                         ({"dtype": "float32"}, "list")):
            with pytest.raises(wire.WireError, match=why):
                wire.take(view, bad)
        with pytest.raises(wire.WireError, match="do not fit"):
            wire.put(view, [torch.zeros(2048)])
    finally:
        view.release()
        mapped.close()
        os.close(fd)


def test_the_wire_refuses_oversized_and_non_json_messages():
    r, w = os.pipe()
    try:
        os.write(w, (wire.MESSAGE_BYTES + 1).to_bytes(4, "big"))
        with pytest.raises(wire.WireError, match="announced"):
            wire.receive(r)
        os.write(w, (3).to_bytes(4, "big") + b"{x}")
        with pytest.raises(wire.WireError, match="not JSON"):
            wire.receive(r)
        os.write(w, (2).to_bytes(4, "big") + b"[]")
        with pytest.raises(wire.WireError, match="not a JSON object"):
            wire.receive(r)
    finally:
        os.close(r)
        os.close(w)


def test_the_wire_fails_closed_on_a_deeply_nested_frame():
    """A frame nested deeper than MAX_DEPTH is refused before json.loads sees it (64 KiB of "["
    raised RecursionError there, which is not a WireError: the worker was not marked broken); a
    protocol message nested as deep as the protocol's own passes."""
    r, w = os.pipe()
    try:
        deep = b"[" * (wire.MESSAGE_BYTES - 8)
        os.write(w, len(deep).to_bytes(4, "big") + deep)
        with pytest.raises(wire.WireError, match=f"nested {len(deep)} deep .at most {wire.MAX_DEPTH}"):
            wire.receive(r, timeout_s=5)
        fine = json.dumps({"tensors": [{"shape": [[1]], "note": "[[[[" * 40}]}).encode()
        os.write(w, len(fine).to_bytes(4, "big") + fine)
        assert wire.receive(r, timeout_s=5)["tensors"][0]["shape"] == [[1]]
    finally:
        os.close(r)
        os.close(w)


# Carried code whose loader, when asked for, writes a deeply nested frame into the worker's reply
# pipe itself (the write end of a pipe among its open files), then answers as usual.
NESTED_FRAME = """

import fcntl as _fcntl
import os as _os


def make_fast_loader(lab, split="train", augment=True):
    frame = b"[" * 60000
    for fd in range(3, 64):
        try:
            if _os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:") and \\
                    _fcntl.fcntl(fd, _fcntl.F_GETFL) & _os.O_ACCMODE == _os.O_WRONLY:
                _os.write(fd, len(frame).to_bytes(4, "big") + frame)
        except OSError:
            pass
    return _naive(lab.profile, split=split, augment=augment, seed=lab.seed)
"""


def test_a_worker_that_writes_a_nested_frame_is_broken_and_its_later_requests_end_saying_so(tmp_path, tiny_data):
    """The nested frame is the reply the judge reads to the loader's request: the worker is marked
    broken there, and every check fails saying so (on the old code each failed with a RecursionError
    and the worker's next replies answered the wrong requests)."""
    code = "import labsupport as ls\n_naive = ls.pipeline.naive_loader\n" + NESTED_FRAME
    verdict = judge(tmp_path, tiny_data, code)
    for c, v in verdict["checks"].items():
        assert v["status"] == "fail" and "broke off" in v["note"] and f"at most {wire.MAX_DEPTH}" in v["note"], (c, v)


# 06 --------------------------------------------------------------------------------------------

def _earlier_06(reference_code) -> dict[str, str]:
    return {n: reference_code[n] for n in ("02", "03", "05")}


def test_06_reference_is_judged_correct_in_its_workers(tmp_path, tiny_data, reference_code):
    """06 decided by the judge: the reference's assemble_ladder in its worker, on crafted results
    and on the ladder the grader handed over (the verdict processes' rungs beside the judges'), and
    its composed pipeline (their 02 loader, 03 step and 05 choice) in a worker, its timed calls
    checked here against the lab's fp32 step on the batches they kept."""
    verdict = judge(tmp_path, tiny_data, reference_code["06"], notebook="06", earlier=_earlier_06(reference_code),
                    ladder=True)
    assert verdict["judge"] and not verdict["problems"], verdict
    assert statuses(verdict) == {"06-stages": "pass", "06-ladder-table": "pass", "06-end-to-end": "n/a",
                                 "06-html": "pass"}, verdict["checks"]
    assert "your loader and step: " in verdict["checks"]["06-end-to-end"]["note"], verdict["checks"]


def test_06_the_release_with_a_decorator_that_bends_the_judge_when_loaded_earns_nothing(tmp_path, tiny_data,
                                                                                        reference_code):
    """The untouched release plus one decorator that, as the carried code loads, makes every
    verdict a pass: it loads in the student's worker only, so the judge's verdicts are its own,
    and the worker's guard names what it replaced: every check fails. Without the decorator, the
    stages (the grader's records, handed over) pass, and the three checks that run the student's
    assemble_ladder fail on the release's NotImplementedError."""
    code = """
import labsupport.grading as _grading


def _everything_passes(fn):
    _grading.judge = lambda check, measured, machine, **kw: _grading.CheckResult(
        check, measured, 0.0, "higher", "cpu", "pass", "")
    return fn


@_everything_passes
def assemble_ladder(frame):
    raise NotImplementedError("build the ladder table")
"""
    verdict = judge(tmp_path / "decorated", tiny_data, code, notebook="06", earlier=_earlier_06(reference_code),
                    ladder=True)
    assert_caught_patching(verdict, "labsupport.grading.judge")
    release = code.replace("@_everything_passes\n", "")
    verdict = judge(tmp_path / "release", tiny_data, release, notebook="06", earlier=_earlier_06(reference_code),
                    ladder=True)
    assert statuses(verdict) == {"06-stages": "pass", "06-ladder-table": "fail", "06-end-to-end": "fail",
                                 "06-html": "fail"}, verdict["checks"]
    assert all("NotImplementedError" in verdict["checks"][c]["note"]
               for c in ("06-ladder-table", "06-end-to-end", "06-html")), verdict["checks"]


def test_06_a_pipeline_whose_step_does_less_after_its_first_calls_loses_end_to_end_only(tmp_path, tiny_data,
                                                                                        reference_code):
    """03's step, carried into 06's pipeline, honest for its first calls and then training only the
    classifier: three timed calls, chosen after the timing, are trained again in the judge by the
    lab's fp32 step on the batches they kept, and differ. The other checks keep their points."""
    earlier = _earlier_06(reference_code)
    earlier["03"] += """

_honest = amp_train_step


def amp_train_step(model, optimizer, scaler, images, labels, dtype):
    model._calls = getattr(model, "_calls", 0) + 1
    if model._calls > 4:  # past the partner's first calls: only the classifier learns
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("fc."))
    return _honest(model, optimizer, scaler, images, labels, dtype)
"""
    verdict = judge(tmp_path, tiny_data, reference_code["06"], notebook="06", earlier=earlier, ladder=True)
    e2e = verdict["checks"]["06-end-to-end"]
    assert e2e["status"] == "fail" and "timed call (sampled after the timing" in e2e["note"], e2e
    assert statuses(verdict) == {"06-stages": "pass", "06-ladder-table": "pass", "06-end-to-end": "fail",
                                 "06-html": "pass"}, verdict["checks"]


def test_06_tables_cross_the_wire_as_plain_values():
    """What the judge sends the student's assemble_ladder and reads back: numbers, None and text,
    each column's kind as pandas infers it; anything else as text."""
    import math

    import pandas as pd

    from labsupport.grading import g06_report

    frame = g06_report.crafted_results()
    back = g06_report.table_from(json.loads(json.dumps(g06_report.table_message(frame))))
    assert list(back.columns) == list(frame.columns) and list(back.index) == list(frame.index)
    for column in frame.columns:
        for a, b in zip(frame[column], back[column]):
            assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), (column, a, b)
    odd = pd.DataFrame({"x": [object(), 1 + 2j]}, index=["a", "b"])
    assert all(isinstance(v, str) for v in g06_report.table_message(odd)["data"][0])
    with pytest.raises(ValueError):
        g06_report.table_from({"index": [1], "columns": ["a"], "data": [[{"not": "plain"}]]})


def test_06_what_a_pipeline_says_of_its_timed_calls_is_checked_in_the_judge():
    """The two things 06's judge takes from the student's worker about its timed calls, checked:
    a call it says a float16 GradScaler skipped must have changed no weight, and the batch a call
    kept must be the profile's shape (the fp32 partner then trains on it)."""
    from labsupport.grading import grading_lab, partners
    from labsupport.grading.g06_report import kept_batches_train_as_fp32

    lab = grading_lab()
    b, s = lab.profile.batch_size, lab.profile.image_size

    class Pipeline:
        def __init__(self, skipped, images):
            self._skipped, self._images = skipped, images

        def skipped(self):
            return self._skipped

        def kept(self, index):
            return [self._images, torch.zeros(b, dtype=torch.int64)]

    calls = [partners.Call(torch.full((62, 16), 1e-3), torch.tensor(1.0), 0) for _ in range(4)]
    ok, why = kept_batches_train_as_fp32(Pipeline([True, False, False, False], torch.zeros(b, 3, s, s)), calls,
                                         [1, 2, 3, 4], lab)
    assert not ok and "counts as skipped by the GradScaler, yet it changed the weights" in why, why
    ok, why = kept_batches_train_as_fp32(Pipeline([False] * 4, torch.zeros(b, 3, s // 2, s // 2)), calls,
                                         [1, 2, 3, 4], lab)
    assert not ok and "kept a batch of" in why, why
    ok, why = kept_batches_train_as_fp32(Pipeline([False] * 3, torch.zeros(b, 3, s, s)), calls, [1, 2, 3, 4], lab)
    assert not ok and "accounted for 3 of its 4" in why, why


# 01 --------------------------------------------------------------------------------------------

def test_01_reference_is_judged_correct_in_its_worker(tmp_path, tiny_data, reference_code):
    """01 decided by the judge, with no baseline worker: the reference's timer, diagnosis and
    top operators called in the student's worker, and its labelled_step profiled there (no trace
    file is read: the kernel wrote none here); this machine's phase breakdown and 01's rung
    measured by the judge itself."""
    verdict = judge(tmp_path, tiny_data, reference_code["01"], notebook="01")
    assert verdict["judge"] and not verdict["problems"], verdict
    assert statuses(verdict) == {"01-throughput-error": "pass", "01-throughput-sync": "n/a", "01-diagnose": "pass",
                                 "01-trace": "pass", "01-phases-labelled": "pass", "01-top-operators": "pass"}, \
        verdict["checks"]
    assert verdict["rung"] > 0 and (tmp_path / "judged" / "01-baseline.json").is_file(), verdict


# A labelled_step whose labels hold token work, the real step run after them.
LABELS_AROUND_TOKEN_WORK = """

def labelled_step(batches, step):
    batch = next(batches)
    images, labels = step.to_device(*batch)
    w = torch.zeros(1, 3, 3, 3, requires_grad=True)
    spare = torch.optim.SGD([w], lr=0.1)
    with record_function("data wait"):
        pass
    with record_function("host to device"):
        pass
    with record_function("forward"):
        token = torch.nn.functional.conv2d(images[:1], w).sum()
    with record_function("backward"):
        token.backward()
    with record_function("optimizer"):
        spare.step()
    loss = torch.nn.functional.cross_entropy(step.model(images), labels)
    loss.backward()
    step.optimizer.step()
    step.optimizer.zero_grad()
    return loss.item()
"""


def test_01_a_halved_timer_and_labels_around_token_work_lose_exactly_their_checks(tmp_path, tiny_data,
                                                                                   reference_code):
    """A timer that reports half the time, with carried code that makes labsupport's known workload
    sleep half as long in the student's worker, so that its own record of its calls agrees: the
    worker's guard names the replaced sleep, and every check fails. With the guard's originals in
    place (the bending done after the checks' guard could look, as in the verdict process), a
    20 ms sleep cannot take 10 ms: the timer's check fails saying so. The same submission's
    labelled_step labels token work (a convolution, its backward, a spare optimizer's step) and
    runs the real step after the labels: profiled in the worker, its forward and backward labels
    hold 1 of the network's 20 convolutions, and it loses the phases check alone (it trains, so
    01-trace holds). The rest keep their points."""
    code = reference_code["01"] + """

from labsupport.grading import g01_worker as _g01

_honest_timer, _honest_sleep = measure_throughput, _g01._sleep
_g01._sleep = lambda seconds: _honest_sleep(seconds / 2)


def measure_throughput(step, device, *, warmup, steps, samples_per_step):
    return _honest_timer(step, device, warmup=warmup, steps=steps, samples_per_step=samples_per_step)
"""
    verdict = judge(tmp_path / "caught", tiny_data, code, notebook="01")
    assert_caught_patching(verdict, "g01_worker._sleep")
    # The same sleep halved from inside the timer, where only the judge's own clock can tell.
    code = reference_code["01"] + """

from labsupport.grading import g01_worker as _g01

_honest_timer, _honest_sleep = measure_throughput, _g01._sleep


def measure_throughput(step, device, *, warmup, steps, samples_per_step):
    _g01._sleep = lambda seconds: _honest_sleep(seconds / 2)
    try:
        return _honest_timer(step, device, warmup=warmup, steps=steps, samples_per_step=samples_per_step)
    finally:
        _g01._sleep = _honest_sleep
"""
    code += LABELS_AROUND_TOKEN_WORK
    verdict = judge(tmp_path, tiny_data, code, notebook="01")
    timer = verdict["checks"]["01-throughput-error"]
    assert timer["status"] == "fail" and "not what its sleeps can take" in timer["note"], timer
    assert statuses(verdict) == {"01-throughput-error": "fail", "01-throughput-sync": "n/a", "01-diagnose": "pass",
                                 "01-trace": "pass", "01-phases-labelled": "fail", "01-top-operators": "pass"}, \
        verdict["checks"]
    phases = verdict["checks"]["01-phases-labelled"]
    assert phases["measured"] == 3 and "'forward', 'backward' wrap not the work" in phases["note"], phases


# A timer that is labsupport's, a diagnosis that is the grader's, and a labelled step around another network.
DELEGATED_01 = """

from labsupport.measure import time_steps as _timer
from labsupport.grading import g01_profile as _g01


def measure_throughput(step, device, *, warmup, steps, samples_per_step):
    times = _timer(step, device, warmup=warmup, steps=steps, samples_per_step=samples_per_step)
    return {**times.summary(), "images_per_s": times.samples_per_s}


def diagnose(breakdown):
    return getattr(_g01, "_bottleneck")(breakdown)


_small = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                             torch.nn.Linear(8, 10))
_spare = torch.optim.SGD(_small.parameters(), lr=0.1)


def labelled_step(batches, step):
    with record_function("data wait"):
        images, labels = next(batches)
    with record_function("host to device"):
        images, labels = step.to_device(images[:4], labels[:4])
    with record_function("forward"):
        loss = torch.nn.functional.cross_entropy(_small(images), labels)
    with record_function("backward"):
        loss.backward()
    with record_function("optimizer"):
        _spare.step()
        _spare.zero_grad()
    with torch.no_grad():
        for p in step.model.parameters():
            p.add_(1e-4 * torch.randn_like(p))
    return loss.item()
"""


def test_01_answers_from_labsupport_or_the_grader_and_another_network_lose_exactly_their_checks(
        tmp_path, tiny_data, reference_code):
    """In the worker as in the self-check: a timer that is labsupport's time_steps (aliased) loses
    both timer checks, a diagnosis asked of the grader's _bottleneck (a getattr chain) loses its
    check, each naming what was called; a labelled_step around a small other network on 4 images,
    the step's own weights only nudged, is no training step of the model handed over (its
    convolutions never ran, the shapes are not the batch's): the trace and the phases fail. The top
    operators keep their points."""
    verdict = judge(tmp_path, tiny_data, reference_code["01"] + DELEGATED_01, notebook="01")
    assert statuses(verdict) == {"01-throughput-error": "fail", "01-throughput-sync": "fail", "01-diagnose": "fail",
                                 "01-trace": "fail", "01-phases-labelled": "fail", "01-top-operators": "pass"}, \
        verdict["checks"]
    checks = verdict["checks"]
    assert "called labsupport.measure.time_steps" in checks["01-throughput-error"]["note"], checks
    assert "called labsupport.grading.g01_profile._bottleneck" in checks["01-diagnose"]["note"], checks
    assert "ran [0, 0, 0, 0] of its 20 convolution layers" in checks["01-trace"]["note"], checks
    assert "`step.model` itself" in checks["01-phases-labelled"]["note"], checks


# 04 --------------------------------------------------------------------------------------------

STATUSES_04 = {"04-grad-match": "pass", "04-activation-ratio": "pass", "04-peak-ratio": "n/a",
               "04-fits-budget": "pass", "04-time-overhead": "n/a", "04-accum-match": "pass",
               "04-training-memory": "pass"}


def test_04_reference_is_judged_correct_in_its_workers(tmp_path, tiny_data, reference_code):
    """04 decided by the judge: the reference's checkpointing and accumulation in its worker, the
    plain step in the baseline's; gradients, statistics, byte counts and each timed call's update
    come back; the large batch's gradients are the judge's own, and each worker's resident memory
    is read from outside (checked against the count's saving where that exceeds the slack). The
    rung (their checkpointing around their 03 step, fed by their 02 loader, at twice the batch) is
    timed from the judge, its peak counted in the worker."""
    verdict = judge(tmp_path, tiny_data, reference_code["04"], notebook="04",
                    earlier={n: reference_code[n] for n in ("02", "03")})
    assert verdict["judge"] and not verdict["problems"], verdict
    assert statuses(verdict) == STATUSES_04, verdict["checks"]
    assert "resident memory read from outside" in verdict["checks"]["04-fits-budget"]["note"], verdict
    from labsupport.hardware import PROFILES

    record = json.loads((tmp_path / "judged" / "04-memory.json").read_text())
    rung = record["metrics"]
    assert rung["timed_by"] == "the grader's judge, from outside" and rung["peak_bytes"] > 0, rung
    assert rung["batch_size"] == record["profile"]["batch_size"] == 2 * PROFILES["tiny"].batch_size, record
    assert verdict["rung"] > 0, verdict


def test_04_a_checkpointing_that_stops_recomputing_after_its_first_calls_loses_the_overhead_only(
        tmp_path, tiny_data, reference_code):
    """A checkpointed network honest for its first forwards, then running its segments plainly
    (no recomputation: cheaper, and the same gradients): every timed call's convolutions are
    counted where it runs, against an untimed call's, so it fails the overhead check as incorrect,
    and nothing else."""
    code = reference_code["04"] + """

_honest_wrap = checkpointed


def checkpointed(model, segments):
    honest = _honest_wrap(model, segments)

    class _Tiring(nn.Module):
        def __init__(self):
            super().__init__()
            self.honest, self.calls = honest, 0

        def forward(self, x):
            self.calls += 1
            return self.honest(x) if self.calls <= 7 else model(x)
    return _Tiring()
"""
    verdict = judge(tmp_path, tiny_data, code, notebook="04", earlier={n: reference_code[n] for n in ("02", "03")})
    overhead = verdict["checks"]["04-time-overhead"]
    assert overhead["status"] == "fail" and "convolutions" in overhead["note"], overhead
    assert statuses(verdict) == {**STATUSES_04, "04-time-overhead": "fail"}, verdict["checks"]


# The network as it came, not checkpointed: what three kinds of student write, from careless to
# clever. Each keeps its gradients (grad-match holds) and its accumulation.
UNWRAPPED = """

def checkpointed(model, segments):
    return model
"""

# ... with labsupport's memory counters made to read a quarter, as the code loads.
FAKED_COUNTS = """
import dataclasses as _dc
import labsupport.memory as _memory

_forward_bytes, _peak_step_bytes = _memory.forward_bytes, _memory.peak_step_bytes
_memory.forward_bytes = lambda fn, device: _forward_bytes(fn, device) // 4
_memory.peak_step_bytes = lambda fn, device, **kw: _dc.replace(
    _peak_step_bytes(fn, device), peak_bytes=_peak_step_bytes(fn, device).peak_bytes // 4)
"""

# ... with the counters made to read a quarter only when checkpointed() is called (after the load).
FAKED_WHEN_CALLED = """
import dataclasses as _dc
import labsupport.memory as _memory


def checkpointed(model, segments):
    forward_bytes, peak_step_bytes = _memory.forward_bytes, _memory.peak_step_bytes
    _memory.forward_bytes = lambda fn, device: forward_bytes(fn, device) // 4
    _memory.peak_step_bytes = lambda fn, device, **kw: _dc.replace(
        peak_step_bytes(fn, device), peak_bytes=peak_step_bytes(fn, device).peak_bytes // 4)
    return model
"""


CHECKPOINTING_04 = ("04-grad-match", "04-activation-ratio", "04-peak-ratio", "04-fits-budget", "04-time-overhead")


def test_04_a_network_that_recomputes_nothing_earns_no_memory_or_overhead_point(tmp_path, tiny_data,
                                                                                reference_code):
    """Not checkpointed: backward recomputes nothing, so its convolutions number the plain step's.
    It keeps grad-match and its accumulation; the memory and overhead checks fail as incorrect,
    saying so."""
    code = reference_code["04"] + UNWRAPPED
    verdict = judge(tmp_path, tiny_data, code, notebook="04", earlier={n: reference_code[n] for n in ("02", "03")})
    lost = {c: "fail" for c in CHECKPOINTING_04[1:]}
    assert statuses(verdict) == {**STATUSES_04, **lost}, verdict["checks"]
    for check in lost:
        found = verdict["checks"][check]
        assert found["reason"] == "incorrect" and "recomputed no segment" in found["note"], found


def test_04_a_saving_the_count_claims_must_show_in_the_memory_read_from_outside():
    """The rule, on figures measured by the judge (MiB, at the doubled batch; class cpu): an honest
    saving passes with the widest noise seen between two workers (here 100 MiB counted, 45 less read
    from outside); a step that hides a large saving from the count (200 MiB, beside the highest
    resident fall a hiding network showed, 13) fails naming both figures; a hidden saving within
    the noise is not caught (74 and 13: that network at 96 px), nor one below the slack (the
    reference at 96 px and at the cpu profile: 38 and 3, 33 and 27), nor one not read (a GPU)."""
    from labsupport.grading.g04_checkpointing import resident_problem

    mib = 2**20

    def problem(counted: float, seen: float | None) -> str:
        return resident_problem({"plain-2x": 400 * mib, "ckpt-2x": (400 - counted) * mib},
                                {"plain-2x": 1000 * mib, "ckpt-2x": None if seen is None else (1000 - seen) * mib})

    assert problem(100, 55) == problem(38, 3) == problem(33, 27) == ""
    assert "fell by 200 MiB" in problem(200, 13) and "by 13 MiB" in problem(200, 13)
    assert problem(74, 13) == problem(40, -40) == problem(200, None) == ""


def test_04_memory_counters_faked_as_the_code_loads_fail_every_04_check(tmp_path, tiny_data, reference_code):
    """The unwrapped network with labsupport's byte counters replaced in its worker when the code
    loads: the worker's guard puts them back and names them, and the notebook earns nothing."""
    code = reference_code["04"] + UNWRAPPED + FAKED_COUNTS
    verdict = judge(tmp_path, tiny_data, code, notebook="04", earlier={n: reference_code[n] for n in ("02", "03")})
    assert set(statuses(verdict).values()) == {"fail"}, verdict["checks"]
    assert any("labsupport.memory.forward_bytes" in p and "when it was loaded" in p for p in verdict["problems"])
    assert verdict["rung"] is None, verdict


def test_04_memory_counters_faked_when_checkpointed_is_called_fail_its_checks_only(tmp_path, tiny_data,
                                                                                  reference_code):
    """The same counters replaced from inside ``checkpointed``, once the checks run: the judge asks
    the worker's guard after each check, so the checkpointing checks fail naming what was replaced,
    and the accumulation, measured with the originals back, still passes."""
    code = reference_code["04"] + FAKED_WHEN_CALLED
    verdict = judge(tmp_path, tiny_data, code, notebook="04", earlier={n: reference_code[n] for n in ("02", "03")})
    assert statuses(verdict) == {**STATUSES_04, **{c: "fail" for c in CHECKPOINTING_04}}, verdict["checks"]
    for check in CHECKPOINTING_04:
        note = verdict["checks"][check]["note"]
        assert "labsupport.memory" in note and "while it was measured" in note, (check, note)


# 07 --------------------------------------------------------------------------------------------

STATUSES_07 = {"07-sparsity": "pass", "07-pruned-accuracy": "n/a", "07-int8-size": "pass",
               "07-int8-speedup": "n/a", "07-int8-accuracy": "n/a", "07-distill-loss": "pass",
               "07-distill-accuracy": "n/a"}


def test_07_reference_is_judged_correct_in_its_worker(tmp_path, tiny_data, reference_code):
    """07 decided by the judge, with no baseline worker: the judge trains fp32 and sends its weights;
    the student's pruning and quantisation run in their worker; the pruned weights come back, and
    the int8 model comes back exported, as data, rebuilt here from allowlisted operators."""
    verdict = judge(tmp_path, tiny_data, reference_code["07"], notebook="07")
    assert verdict["judge"] and not verdict["problems"], verdict
    assert statuses(verdict) == STATUSES_07, verdict["checks"]
    assert abs(verdict["checks"]["07-sparsity"]["measured"] - 0.5) < 0.005
    assert verdict["checks"]["07-int8-size"]["measured"] < 0.26, verdict["checks"]["07-int8-size"]


def test_07_a_worker_that_reports_int8_and_pruned_for_an_fp32_model_earns_nothing(tmp_path, tiny_data,
                                                                                  reference_code):
    """The release's answers replaced by cheats that also bend, in their own worker, what 07
    measures with (the sparsity count, the int8 reading, the description of a model, the
    distillation check): int8 copies held while the fp32 model computes, masks left in place,
    and a distillation loss without the teacher. The worker's guard names what was bent, and
    every check fails; without the bending, the judge counts and reads the weights and the
    exported graph itself, and every check fails on what it found."""
    code = reference_code["07"] + """

import labsupport.compress as _compress
from labsupport.grading import exported as _exported


class _Held(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.copies = [m.weight.detach().to(torch.int8) for _, m in _compress.prunable(model)]

    def forward(self, x):
        return self.model(x)


def quantize_int8(model, calibration):
    return _Held(model)


def make_permanent(model):
    return model  # the masks stay: weight_orig is dense


def distillation_loss(student_logits, teacher_logits, labels, alpha, temperature):
    return torch.nn.functional.cross_entropy(student_logits, labels)  # no teacher


"""
    bending = """
_g07 = __import__("labsupport.grading.g07_compression", fromlist=["x"])
_g07._distill_errors = lambda cases, got: (0.0, "")  # the worker's copy of the check, bent


_compress.computed_with = lambda model, batch: _compress.ComputedWith(11_000_000, 11_000_000)
_compress.sparsity = lambda model: _compress.Sparsity(5_590_000, 11_180_000, ())
_exported.OPERATORS = frozenset(["anything"])
"""
    verdict = judge(tmp_path / "bent", tiny_data, code + bending, notebook="07")
    assert_caught_patching(verdict, "labsupport.compress.sparsity")
    verdict = judge(tmp_path, tiny_data, code, notebook="07")
    assert statuses(verdict) == dict.fromkeys(STATUSES_07, "fail"), verdict["checks"]
    checks = verdict["checks"]
    assert "weight_orig and weight_mask" in checks["07-sparsity"]["note"] and checks["07-sparsity"]["measured"] == 0
    assert "does not compute with int8 weights" in checks["07-int8-size"]["note"], checks["07-int8-size"]
    assert checks["07-int8-size"]["measured"] > 0.9, checks["07-int8-size"]
    assert "teacher is left out" in checks["07-distill-loss"]["note"], checks["07-distill-loss"]


def test_07_a_described_model_is_rebuilt_from_allowlisted_operators_and_plain_arguments_only():
    """What crosses for 07's int8 model is data: an operator outside the list, a keyword that is not
    the operator's own (it would become Python source in the rebuilt forward), a reference to a
    later node or a tensor not sent are refused, naming what; the honest form rebuilds and runs."""
    from labsupport.grading.exported import Described, NotAModel, describe, rebuild

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 2)).eval()
    x = torch.randn(2, 3, 8, 8)
    described = describe(model, x)
    with torch.no_grad():
        assert torch.allclose(rebuild(Described.decoded([described.encoded(), *described.tensors]))(x), model(x))
    call = next(i for i, n in enumerate(described.nodes) if n["op"] == "call")
    bad = {
        "an operator outside the list": {**described.nodes[call], "target": "aten.from_file.default"},
        "a keyword that is source code": {**described.nodes[call], "kwargs": {"x=__import__('os').system('id'), y": 1}},
        "a reference to a later node": {**described.nodes[call], "args": [{"node": len(described.nodes) - 1}]},
    }
    for what, node in bad.items():
        nodes = list(described.nodes)
        nodes[call] = node
        with pytest.raises(NotAModel):
            rebuild(Described(nodes, described.tensors))
            pytest.fail(what)
    with pytest.raises(NotAModel):
        rebuild(Described([{"op": "tensor", "index": 99}, *described.nodes], described.tensors))


REBUILT_INT8_KERNELS = """
import json, sys, torch
from labsupport import compress
from labsupport.grading import exported
described = exported.Described.decoded(torch.load(sys.argv[1], weights_only=True))
before = sorted(m for m in sys.modules if m.split(".")[0] == "torchao")
model, x = exported.rebuild(described), torch.randn(4, 3, 32, 32)
with compress.serving():
    fast = compress.compiled(model)
    fast(x)
    with torch.profiler.profile() as prof:
        fast(x)
print(json.dumps({"torchao_before": before, "ops": sorted({e.key for e in prof.key_averages()})}))
"""


def test_07_an_int8_model_compiled_where_it_was_not_quantised_runs_int8_kernels(tmp_path):
    """The judge compiles the int8 model its worker exported, in a process that never imported
    torchao. Inductor's int8 passes are registered only by importing torchao's x86 quantiser, so
    without :func:`labsupport.compress.serving` doing it each int8 convolution was lowered to
    dequantise-then-fp32: the reference's int8 speedup read 0.55x in the judge and 2.8x in the
    notebook (real profile, class cpu-bf16). A fresh process compiles it to oneDNN's int8 kernels."""
    from autograder import reference
    from labsupport import compress
    from labsupport.grading import exported

    model = compress.small_network().eval()
    calibration = [torch.randn(4, 3, 32, 32) for _ in range(2)]
    with compress.quiet():
        int8 = reference.namespace("07")["quantize_int8"](model, calibration)
    described = exported.describe(int8, calibration[0])
    torch.save([described.encoded(), *described.tensors], tmp_path / "described.pt")
    done = subprocess.run([sys.executable, "-c", REBUILT_INT8_KERNELS, str(tmp_path / "described.pt")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["torchao_before"] == [], seen  # the test means something only where torchao was not loaded
    assert any("qconv" in op for op in seen["ops"]), seen["ops"]
