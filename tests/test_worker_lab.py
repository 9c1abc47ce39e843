"""A judge's worker, where the student's code runs, has labsupport without the checks, the
correctness partners and the judge's side (issue 59: a ``break_even_steps`` that imported 05's
checks and asked them for the expected answers passed): every notebook's worker side and rung still
import there, and nothing that computes a graded answer does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import labsupport
from labsupport import notebooks
from labsupport.grading import judge_setup, module_name

PROBE = """
import importlib, sys
from labsupport.grading import rungs, worker
worker.watched_libraries()  # what every worker does first: import every labsupport module there is
for number in sys.argv[1].split(","):
    importlib.import_module(f"labsupport.grading.g{number}_worker")
    rungs.of(number)
for name in sys.argv[2].split(","):
    try:
        importlib.import_module(f"labsupport.grading.{name}")
    except ImportError:
        continue
    print("importable:", name)
import labsupport.grading as g
try:
    g.same_batches
    print("importable: same_batches")
except ImportError:
    pass
print("ok")
"""


def test_the_workers_labsupport_lacks_the_checks_and_partners_and_still_serves_every_notebook(tmp_path):
    lib = judge_setup.worker_lab_copy(Path(labsupport.__file__).parent, tmp_path / "worker-lib")
    grading = lib / "labsupport" / "grading"
    graded = [nb.number for nb in notebooks.NOTEBOOKS if nb.graded]
    assert {f"{module_name(n)}.py" for n in graded} | {"partners.py", "judging.py"} <= set(judge_setup.judge_only())
    assert not [name for name in judge_setup.judge_only() if (grading / name).exists()]
    assert not list(lib.rglob("*.pyc")), "a compiled cache would hold a removed module's code"
    assert (grading / "worker.py").is_file() and all((grading / f"g{n}_worker.py").is_file() for n in graded)
    hidden = ",".join(name.removesuffix(".py") for name in judge_setup.judge_only())
    done = subprocess.run([sys.executable, "-P", "-c", PROBE, ",".join(graded), hidden],
                          env={"PYTHONPATH": str(lib), "PATH": "/usr/bin:/bin"}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ok"], done.stdout
