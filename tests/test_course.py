"""The nbgrader course, tested the way nbgrader tests itself: the committed student notebooks are
what the masters generate, every notebook starts with the one setup cell, and grade cells follow
the style. What `nbgrader validate` would show is proven by grading instead (test_instructor.py):
the ``reference`` submission (every master's solution) gets full marks, and ``unchanged`` (the
release as handed out) passes no test cell, in the kernel or by the grader's verdicts."""

import nbformat
import pytest

from autograder import course, release, run

MASTERS = course.masters()
if not MASTERS:
    pytest.skip(f"no master notebooks in {course.COURSE_ROOT / 'source' / course.assignment_id()} "
                "yet: nothing to release or validate", allow_module_level=True)

RELEASE = "run `python -m autograder release` and commit notebooks/"


def _read(path):
    return nbformat.read(path, as_version=4)


def _student(master):
    path = course.NOTEBOOKS_DIR / master.name
    assert path.exists(), f"{path} is missing: {RELEASE}"
    return path


def test_committed_notebooks_match_a_fresh_release():
    diffs = release.student_version_differences(course.COURSE_ROOT, course.NOTEBOOKS_DIR)
    assert not diffs, (f"notebooks/ is not what generate_assignment makes of the masters; {RELEASE}."
                       "\n" + "\n".join(diffs))


@pytest.mark.parametrize("master", MASTERS, ids=lambda p: p.stem)
def test_committed_notebooks_have_outputs_cleared(master):
    dirty = course.uncleared_cells(_read(_student(master)))
    assert not dirty, (f"notebooks/{master.name}: code cells {dirty} hold outputs or execution "
                       f"counts; {RELEASE} (never commit a student notebook that was run).")


@pytest.mark.parametrize("master", MASTERS, ids=lambda p: p.stem)
def test_master_starts_with_the_locked_setup_cell(master):
    problems = course.setup_cell_problems(_read(master), master.name)
    assert not problems, ("\n".join(problems) + "\nThe setup cell comes from "
                          "autograder/setup_cell.py: run `python -m autograder release` (it writes "
                          "the template into every master) and commit the masters and notebooks/.")


def test_optional_notebooks_are_registered_and_hold_no_solution():
    """A master without graded test cells is optional (08_distributed): released to students, never
    collected or graded, so it may hold no solution cell either."""
    from labsupport import notebooks

    optional = [m for m in MASTERS if m not in course.graded_masters()]
    assert [m.stem for m in optional] == ["08_distributed"]
    for master in optional:
        assert notebooks.get(master.stem[:2]).graded == ()
        assert not [c for c in _read(master).cells if c.metadata.get("nbgrader", {}).get("solution")]


@pytest.mark.parametrize("master", course.graded_masters(), ids=lambda p: p.stem)
def test_master_has_graded_test_cells_in_style(master):
    tests = course.graded_test_cells(_read(master))
    with_points = [c for c in tests if float(c.metadata["nbgrader"].get("points", 0)) > 0]
    assert with_points, (f"{master.name} has no autograded test cell with points: mark a test cell "
                         "'Autograder tests' in the nbgrader toolbar and give it points.")
    for cell in tests:
        grade_id = cell.metadata["nbgrader"]["grade_id"]
        assert cell.source.startswith('"""Check that'), (
            f'{master.name}, test cell {grade_id}: start it with a docstring """Check that ..."""'
            " saying what it checks (the style rule for grade cells).")


def test_only_a_missed_speed_or_memory_bar_counts_as_information():
    """make run lets a missed bar through (calibrate fixes the bar per machine), told by the reasons
    the kernel kept, not by its message; a failed correctness partner, an optimisation not in the
    code, a missing stage or a count never passes as one."""
    assert run.bar_missed("04-time-overhead", "below bar") and run.bar_missed("06-end-to-end", "below bar")
    assert run.bar_missed("02-data-wait-share", "below bar")  # also: the wait did not fall against the naive loader's
    assert not run.bar_missed("03-amp-speedup", "incorrect")
    assert not run.bar_missed("05-compile-speedup", "not optimised")
    assert not run.bar_missed("04-time-overhead", "error") and not run.bar_missed("04-time-overhead", "not measured")
    assert not run.bar_missed("06-stages", "below bar") and not run.bar_missed("04-grad-match", "below bar")

    nb = _read(course.masters()[3])  # 04: one graded cell fails on a bar, another on its partner
    cells = {c.metadata["nbgrader"]["grade_id"]: c for c in course.graded_test_cells(nb)}
    error = lambda text: [nbformat.v4.new_output("error", ename="AssertionError", evalue=text, traceback=[])]  # noqa: E731
    cells["test_time_overhead"].outputs = error("04-time-overhead failed on cpu: measured 0.419, needs <= 0.4.")
    cells["test_grad_match"].outputs = error("04-grad-match failed on cpu: measured 0. gradients #3 differ")
    kept = {"04-time-overhead": {"result": "FAIL", "reason": "below bar"},
            "04-grad-match": {"result": "FAIL", "reason": "incorrect"}}
    misses, failures = run.outcomes(nb, "04_checkpointing", kept)
    assert [m["check"] for m in misses] == ["04-time-overhead"]
    assert len(failures) == 1 and "04-grad-match failed" in failures[0]
    # the same message with a reason that is not a bar's (a timed call that trained otherwise) fails the run
    misses, failures = run.outcomes(nb, "04_checkpointing", {**kept, "04-time-overhead": {"result": "FAIL",
                                                                                          "reason": "incorrect"}})
    assert misses == [] and len(failures) == 2


def test_make_tests_file_order_starts_with_the_longest_files_and_needs_no_entry_for_a_new_one():
    """make test hands the test files to its workers longest first: conftest's LONGEST_FIRST, which
    names only files that exist, then every other file, the largest first."""
    from pathlib import Path

    import conftest

    paths = sorted(Path(conftest.__file__).parent.glob("test_*.py"))
    assert set(conftest.LONGEST_FIRST) <= {p.name for p in paths}, "LONGEST_FIRST names a file that is gone"
    order = [p.name for p in sorted(paths, key=conftest.file_rank)]
    assert order[:len(conftest.LONGEST_FIRST)] == list(conftest.LONGEST_FIRST)
    rest = [p for p in sorted(paths, key=conftest.file_rank) if p.name not in conftest.LONGEST_FIRST]
    assert [p.stat().st_size for p in rest] == sorted((p.stat().st_size for p in rest), reverse=True)


def test_the_setup_cell_keeps_an_old_torch_and_says_what_to_do(monkeypatch, capsys):
    """In Colab the setup cell installs labsupport on top of the runtime's torch. Below the floor
    pyproject.toml states it stops, saying what an upgrade costs before asking for one, instead of
    letting pip replace torch (GBs, in every runtime); the floor is the one the package declares.
    Between it and 07's int8 floor it installs, and says that only 07's int8 cell will ask."""
    import importlib.metadata
    import importlib.util
    import re
    import subprocess
    import sys

    floor = re.search(r'"torch>=(\d+)\.(\d+)"', (course.REPO_ROOT / "pyproject.toml").read_text()).groups()
    source = course.setup_cell_source().replace('LAB_URL = ""', 'LAB_URL = "file:///lab.zip"')
    assert f"< ({floor[0]}, {floor[1]})" in source
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "labsupport" else real_find(name, *a))
    installed = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: installed.append(argv))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.4.1+cu121")
    with pytest.raises(RuntimeError, match=rf"torch is 2\.4\.1\+cu121; the lab needs {floor[0]}\.{floor[1]} or newer") as stop:
        exec(compile(source, "setup", "exec"), {})
    assert installed == []
    said = str(stop.value)
    assert "several GB" in said and "minutes" in said and said.index("GB") < said.index("pip install -U"), said
    from labsupport import hardware

    int8 = hardware.FEATURE_FLOORS["int8"][0]
    assert f"< ({int8[0]}, {int8[1]})" in source
    monkeypatch.setattr(importlib.metadata, "version", lambda name: f"{int8[0]}.{int8[1] - 1}.0")
    monkeypatch.setitem(sys.modules, "labsupport", None)
    with pytest.raises(ModuleNotFoundError):
        exec(compile(source, "setup", "exec"), {})
    assert installed and "07's int8" in capsys.readouterr().out
    installed.clear()
    monkeypatch.delitem(sys.modules, "labsupport")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: f"{floor[0]}.{floor[1]}.0")
    monkeypatch.setitem(sys.modules, "labsupport", None)  # "installed", but not importable here
    with pytest.raises(ModuleNotFoundError):
        exec(compile(source, "setup", "exec"), {})
    assert installed and installed[0][-1] == "file:///lab.zip"


def test_registry_masters_grading_modules_and_thresholds_agree():
    """A graded notebook is one row of labsupport/notebooks.py, one master with graded test cells,
    one module of labsupport/grading registering its checks (and declaring its ``RUNG`` where the
    row names a stage, and its ``JUDGED``, how the judge sets up its checks), and a bar per check
    in thresholds.toml: each of them names the same notebooks and the same checks, so a notebook
    left half-added fails here, saying where."""
    import tomllib

    from labsupport import grading, notebooks
    from labsupport.grading import judge_setup, rungs

    for nb in notebooks.NOTEBOOKS:  # a stage without a RUNG raises, naming the module
        assert (rungs.of(nb.number) is not None) == (nb.stage is not None), nb.number
        if nb.stage:  # every rung builds on one before it in the ladder, back to the baseline
            order = [r.number for r in rungs.chain(nb.number)]
            assert order == sorted(order, key=[r.number for r in notebooks.rungs()].index), nb.number

    graded = [nb.number for nb in notebooks.NOTEBOOKS if nb.graded]
    for number in graded:  # a graded module without a JUDGED raises, naming the module
        assert isinstance(judge_setup.setup_of(number), judge_setup.Judged), number
    assert [m.stem[:2] for m in course.graded_masters()] == graded, (
        "the registry's graded notebooks (labsupport/notebooks.py, those that name what the student "
        "writes) must be the masters with graded test cells")
    registered = {number: [c for ids in grading.check_groups(number) for c in ids] for number in graded}
    bars = tomllib.loads(grading.thresholds_path().read_text())["checks"]
    assert sorted(bars) == sorted(c for checks in registered.values() for c in checks), (
        "thresholds.toml must give a bar to every registered check, and to no other")
    for master in course.graded_masters():
        cells = course.graded_test_cells(_read(master))
        declared = [c for cell in cells for c in course.declared_checks(cell, master.stem)]
        assert sorted(declared) == sorted(registered[master.stem[:2]]), (
            f"{master.name}: its test cells must declare each check its grading module registers, once")


def test_every_rung_comes_before_the_notebook_that_reads_the_ladder():
    """06 grades the ladder from the rungs recorded before it: a rung's notebook registered after
    06 could never be shown there (tests/test_toy_notebook.py sees this fail for a toy 09)."""
    from labsupport.grading import judge_setup

    assert judge_setup.order_problems() == []


def test_the_ladder_and_the_composed_pipeline_are_the_rungs_changes_in_turn():
    """Each rung's recipe is the baseline changed by every rung along its chain; 06's pipeline is
    every rung that buys speed (not 04's checkpointing), 05's compile as the student chose."""
    import types

    import torch

    from labsupport import notebooks
    from labsupport.grading import judge_setup, rungs

    def update(*args):
        return None

    def loader(lab):
        return "their loader"

    code = {"02": {"make_fast_loader": loader},
            "03": {"choose_precision": lambda machine: {"dtype": torch.bfloat16, "channels_last": True},
                   "amp_train_step": update},
            "04": {"checkpointed": lambda model, segments: model, "SEGMENTS": 3},
            "05": {"COMPILE_TRAINING": False}}
    lab = types.SimpleNamespace(machine=None, profile=types.SimpleNamespace(batch_size=8))
    made = {nb.number: rungs.recipe(nb.number, code.__getitem__, lab) for nb in notebooks.rungs()}
    assert made["01"] == rungs.Recipe()
    assert made["02"].loader is loader and made["02"].config == rungs.Recipe().config
    assert (made["03"].config.amp_dtype, made["03"].config.channels_last, made["03"].update) == ("bfloat16", True, update)
    assert (made["04"].config.checkpoint_segments, made["04"].config.batch_size, made["04"].update) == (3, 8, update)
    assert made["05"].config.compiled and not made["05"].config.checkpoint_segments
    composed = rungs.pipeline_recipe(code.__getitem__, lab)
    assert composed.loader is loader and composed.update is update and composed.config.amp_dtype == "bfloat16"
    assert not composed.config.compiled and not composed.config.checkpoint_segments
    assert composed.notes == ("your 05 choice",)
    code["05"] = {"COMPILE_TRAINING": True}
    assert rungs.pipeline_recipe(code.__getitem__, lab).config.compiled
    del code["05"]
    assert rungs.pipeline_recipe(code.__getitem__, lab).notes == (
        "not compiled: COMPILE_TRAINING was not kept from 05 (run its checks)",)
    # what a judged notebook's worker loads beside its own code follows from the same rungs
    assert {n: judge_setup.earlier_code(n) for n in judge_setup.NOTEBOOKS} == {
        "01": (), "02": (), "03": ("02",), "04": ("02", "03"), "05": ("02", "03"), "06": ("02", "03", "05"), "07": ()}


@pytest.mark.parametrize("master", course.graded_masters(), ids=lambda p: p.stem)
def test_a_test_cell_requires_exactly_the_checks_it_declares(master):
    """The grader scores a test cell on the checks its metadata declares; the cell's source, which
    the student reads and the kernel runs, must require the same ones."""
    import re

    for cell in course.graded_test_cells(_read(master)):
        required = re.findall(r"""\[\s*["'](\d\d-[a-z0-9-]+)["']\s*\]\.require\(\)""", cell.source)
        assert required == course.declared_checks(cell, master.stem), (master.name, cell.metadata["nbgrader"]["grade_id"])


def test_a_test_cell_that_declares_no_check_is_named():
    cell = nbformat.v4.new_code_cell('"""Check that it is fast."""\ngraded["02-loader-speedup"].require()',
                                     metadata={"nbgrader": {"grade": True, "grade_id": "test_fast", "points": 1}})
    with pytest.raises(course.CourseError, match="02_data_loading, test cell test_fast: declare the checks"):
        course.declared_checks(cell, "02_data_loading")


def test_the_readme_tree_names_every_module_on_a_line_of_its_own():
    """The README's tree is how a newcomer finds a module: every Python module of labsupport,
    labsupport/grading and autograder has its line there (packages' __init__ aside)."""
    from pathlib import Path

    repo = Path(course.__file__).resolve().parents[1]
    text = (repo / "README.md").read_text()
    tree = text[text.index("labsupport/             S"):]
    tree = tree[:tree.index("```")]
    listed = {line.split()[0] for line in tree.splitlines() if line.strip()}
    modules = [p for folder in ("labsupport", "labsupport/grading", "autograder")
               for p in sorted((repo / folder).glob("*.py")) if p.name != "__init__.py"]
    missing = [str(p.relative_to(repo)) for p in modules if p.name not in listed]
    assert not missing, f"add a line for each to README.md's tree: {missing}"


@pytest.mark.parametrize("master", MASTERS, ids=lambda p: p.stem)
def test_every_notebook_states_its_times_and_ends_by_saving_to_drive(master):
    """A sitting per notebook: under the setup cell, a locked cell shows the lab's table of this
    notebook's times (the student's work, at most 90 minutes, and the compute time on every device
    class, measured or estimated, each saying how); the last cell saves Colab's Drive."""
    from labsupport import hardware, notebooks

    nb, number = _read(master), master.stem[:2]
    code = [c for c in nb.cells if c.cell_type == "code"]
    sitting = code[1]
    assert sitting.source.startswith(f'ls.notebooks.sitting("{number}", lab)'), (
        f"{master.name}: the cell under the setup cell must show ls.notebooks.sitting(\"{number}\", lab)")
    assert sitting.metadata.get("nbgrader", {}).get("locked"), f"{master.name}: lock the times cell"
    assert "**Time.**" in nb.cells[0].source and "table under the setup cell" in nb.cells[0].source
    assert 0 < notebooks.STUDENT_MINUTES[number] <= notebooks.MAX_STUDENT_MINUTES, (
        f"{master.name}: {notebooks.STUDENT_MINUTES.get(number)} minutes of student work is not one sitting")
    classes = {times.device_class for times in notebooks.COMPUTE}
    assert set(hardware.CLASSES) <= classes | {"cuda-tensorcore-xl"}, set(hardware.CLASSES) - classes
    for times in notebooks.COMPUTE:
        low, high = times.seconds[number]
        assert 0 < low <= high and times.how, (master.name, times.device_class)
        assert (low == high) if number in times.measured else ("estimat" in times.how), (
            f"{master.name}, {times.device_class}: a measured time is one figure; an estimate says how it was made")
    table = notebooks.sitting(number)
    assert set(table.index) == classes and set(table[""]) <= {"measured", "estimated"}
    from types import SimpleNamespace

    here = notebooks.sitting(number, SimpleNamespace(machine=SimpleNamespace(profile="cpu-bf16")))["this machine"]
    assert list(here[here != ""].index) == ["cpu-bf16"], "the table marks the class it runs on"
    last = code[-1]
    assert "\nls.paths.finish()" in last.source, f"{master.name}: end with ls.paths.finish()"
    assert last.metadata.get("nbgrader", {}).get("locked"), f"{master.name}: lock the last cell"
