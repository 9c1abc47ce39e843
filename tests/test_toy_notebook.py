"""A new graded notebook with a rung touches five files, and is graded end to end through the judge
and the sandbox (issue 61): a toy notebook 09 registered in a copy of the lab.

The copy is this checkout's tracked files, committed in a repository of their own; the toy then
adds its row to ``labsupport/notebooks.py``, its master, its grading module and worker side
(``tests/toy/``) and its bar in ``thresholds.toml``, and nothing else: ``git status`` says so. A
course made from the copy grades the toy's reference solution at the tiny profile with
``python -m autograder grade``, as an instructor would: full marks, decided by the judge, its rung
measured from the student's carried code. And the registry says what the toy gets wrong: its rung
comes after 06, whose checks read the ladder, so 06 could never show it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from autograder import sandbox

pytestmark = pytest.mark.skipif(sandbox.problem() is not None, reason=f"no sandbox here: {sandbox.problem()}")

CHECKOUT = Path(__file__).resolve().parents[1]
TOY = Path(__file__).resolve().parent / "toy"
MAX_FILES = 5  # the bar for a new graded notebook with a rung

ROW = ('    Notebook("09", "09_toy.ipynb", "a toy notebook", ("double", "CHANNELS_LAST"), "09-toy", "+toy",\n'
       '             "the step in the layout your CHANNELS_LAST chose", "01-baseline"),\n')


def _copy_of_the_lab(to: Path) -> None:
    """This checkout's tracked files (as they are now), committed in a repository of their own."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=CHECKOUT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        source = CHECKOUT / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    git = ["git", "-c", "user.name=toy", "-c", "user.email=toy@lab"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the lab"]):
        subprocess.run(git + args, cwd=to, check=True)


def _master(lab: Path) -> nbformat.NotebookNode:
    """09's master: the setup cell every notebook opens with, a solution cell per graded name, the
    checks' run and one graded test cell."""
    setup = next(c for c in nbformat.read(lab / "autograder/source/lab/05_compile.ipynb", 4).cells
                 if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")

    def cell(source, grade_id, *, solution=False, points=None, checks=()):
        made = nbformat.v4.new_code_cell(source)
        made.metadata["nbgrader"] = {"grade": points is not None, "grade_id": grade_id, "locked": not solution,
                                     "schema_version": 3, "solution": solution, "task": False}
        if points is not None:
            made.metadata["nbgrader"]["points"] = points
            made.metadata["lab"] = {"checks": list(checks)}
        return made

    nb = nbformat.v4.new_notebook()
    nb.metadata = nbformat.read(lab / "autograder/source/lab/05_compile.ipynb", 4).metadata
    nb.cells = [nbformat.v4.new_markdown_cell("# 09 · A toy notebook"), setup,
                cell("def double(values):\n    ### BEGIN SOLUTION\n    return [2 * v for v in values]\n"
                     "    ### END SOLUTION", "double", solution=True),
                cell("### BEGIN SOLUTION\nCHANNELS_LAST = True\n### END SOLUTION", "CHANNELS_LAST", solution=True),
                cell('import labsupport.grading\n\ngraded = labsupport.grading.fresh().grading.run("09", globals())\n'
                     "labsupport.grading.table(graded.values())", "graded_checks"),
                cell('"""Check that double doubles."""\ngraded["09-double"].require()', "test_double", points=1,
                     checks=("09-double",))]
    return nb


def _add_the_toy(lab: Path) -> None:
    """The toy's five files, and nothing else."""
    registry = lab / "labsupport/notebooks.py"
    text = registry.read_text()
    assert "\n)\n\nBY_NUMBER" in text, "labsupport/notebooks.py's NOTEBOOKS no longer ends as this test expects"
    registry.write_text(text.replace("\n)\n\nBY_NUMBER", "\n" + ROW.rstrip("\n") + "\n)\n\nBY_NUMBER", 1))
    thresholds = lab / "labsupport/thresholds.toml"
    text = thresholds.read_text()
    start = text.index('[checks."05-break-even"]')
    entry = text[start:text.index("\n\n", start)].replace("05-break-even", "09-double")
    thresholds.write_text(text.rstrip("\n") + "\n\n" + entry + "\n")
    for name in ("g09_toy.py", "g09_worker.py"):
        shutil.copyfile(TOY / name, lab / "labsupport/grading" / name)
    nbformat.write(_master(lab), lab / "autograder/source/lab/09_toy.ipynb")


# In the copy: a course with the toy's release and its reference solution as one student's 09.
MAKE_COURSE = """
import shutil, sys
from pathlib import Path
sys.path.insert(0, "tests")
import scenarios
from autograder import course, release
root = Path(sys.argv[1])
root.mkdir()
shutil.copyfile(course.COURSE_ROOT / course.CONFIG_NAME, root / course.CONFIG_NAME)
shutil.copytree(course.source_dir(), root / "source", ignore=shutil.ignore_patterns("__pycache__"))
released = release.generate(root)
folder = course.of(root).submitted("toy")
scenarios.write("reference", released, root / "source" / "lab", folder)
for path in folder.glob("*.ipynb"):
    if path.stem != "09_toy":
        path.unlink()
"""

ORDER = """
from labsupport.grading import judge_setup
print("\\n".join(judge_setup.order_problems()))
"""


def test_a_toy_notebook_with_a_rung_touches_five_files_and_is_graded_by_the_judge(tmp_path, tiny_data):
    lab = tmp_path / "lab"
    _copy_of_the_lab(lab)
    _add_the_toy(lab)
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=lab,
                             capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(changed) <= MAX_FILES, changed

    env = dict(os.environ, PYTHONPATH=str(lab), LAB_DATA=str(tiny_data), LAB_PROFILE="tiny",
               LAB_CALIBRATION=str(tmp_path / "no-calibration.toml"))
    env.pop("LAB_RESULTS", None)
    run = dict(cwd=lab, env=env, capture_output=True, text=True)
    # The registry agrees with itself (row, master, module, bars) ...
    agree = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                            "tests/test_course.py::test_registry_masters_grading_modules_and_thresholds_agree"], **run)
    assert agree.returncode == 0, agree.stdout[-3000:]
    # ... and says that 06 cannot show the toy's rung: its notebook comes after the ladder's.
    order = subprocess.run([sys.executable, "-c", ORDER], **run)
    assert order.returncode == 0, order.stderr[-2000:]
    assert "09" in order.stdout and "06" in order.stdout, order.stdout

    root = tmp_path / "course"
    made = subprocess.run([sys.executable, "-c", MAKE_COURSE, str(root)], **run)
    assert made.returncode == 0, made.stderr[-3000:]
    graded = subprocess.run([sys.executable, "-m", "autograder", "--course", str(root), "grade"], timeout=1200, **run)
    out = graded.stdout[-3000:] + graded.stderr[-3000:]
    assert graded.returncode == 0, out
    by_check = pd.read_csv(root / "grades_by_check.csv", keep_default_na=False)
    mine = by_check.loc[(by_check.student == "toy") & (by_check.notebook == "09_toy")]
    assert mine.set_index("check").result.to_dict() == {"09-double": "pass"}, mine.to_string() + out
    assert float(mine.score.sum()) == 1.0, mine.to_string()
    summary = pd.read_csv(root / "grading_summary.csv", keep_default_na=False)
    row = summary.loc[(summary.student == "toy") & (summary.notebook == "09_toy")]
    assert list(row.status) == ["graded"], summary.to_string()
    rungs = sorted(root.rglob("09-toy.json"))  # the rung the judge measured, kept for 06's ladder
    assert rungs, sorted(str(p.relative_to(root)) for p in root.rglob("*.json"))[:60]
    import json

    rung = json.loads(rungs[0].read_text())
    assert float(rung["metrics"].get("samples_per_s") or 0) > 0, rung
