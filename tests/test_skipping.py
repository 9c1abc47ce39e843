"""The cells a graded kernel leaves out (autograder/skipping.py): the masters' demonstrations that
nothing graded reads, decided from the student's notebook as handed in, never by running it."""

from __future__ import annotations

import copy

import nbformat
import pytest

from autograder import course, skipping


def _masters():
    return {p.stem: nbformat.read(p, as_version=4) for p in course.graded_masters()}


def _skips(nb, master):
    return skipping.to_skip(nb, skipping.marked(master),
                            {c.id for c in master.cells if c.metadata.get("nbgrader", {}).get("locked")})


def _cell(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def test_the_masters_mark_only_demonstrations_and_their_own_graded_run_skips_each():
    """Every marked cell is a plain code cell (no solution, no test, not read-only), and in each
    master, as the reference hands it in, nothing that runs reads a name a marked cell defines."""
    masters = _masters()
    assert any(skipping.marked(nb) for nb in masters.values())
    for name, nb in masters.items():
        marks = skipping.marked(nb)
        for cell in nb.cells:
            if cell.id in marks:
                assert not cell.metadata.get("nbgrader"), f"{name} {cell.id}: a marked cell is an nbgrader cell"
        assert _skips(nb, nb) == marks, f"{name}: marked but needed: {sorted(marks - _skips(nb, nb))}"


def test_a_solution_that_reads_a_demonstrations_name_keeps_that_cell_and_what_it_needs():
    """05's compile_inference written to read the notebook's `precision` (cell-05 defines it): cell-05
    runs, and so does nothing else marked that it does not need."""
    master = _masters()["05_compile"]
    nb = copy.deepcopy(master)
    solution = _cell(nb, "compile_inference")
    solution.source += "\n\ndef _dtype_of_this_notebook():\n    return precision['dtype']\n"
    skipped = _skips(nb, master)
    assert "cell-05" not in skipped and skipped == skipping.marked(master) - {"cell-05"}
    # a demonstration that defines the name a solution reads, through a cell it needs in turn
    nb = copy.deepcopy(master)
    _cell(nb, "break_even_steps").source += "\n\nDEFAULT_STEPS = len(modes)\n"  # modes: cell-16's, at module level
    skipped = _skips(nb, master)  # cell-16 compiles cell-05's model: both run, the rest is left out
    assert skipped == skipping.marked(master) - {"cell-16", "cell-05"}


def test_code_that_reads_globals_it_does_not_name_runs_the_notebook_whole():
    master = _masters()["05_compile"]
    for edit in ("\n\ndef _sneaky():\n    return globals()['precision']\n",
                 "\n\ndef broken(:\n",
                 "\n\nx = eval('precision')\n"):
        nb = copy.deepcopy(master)
        _cell(nb, "compile_inference").source += edit
        assert _skips(nb, master) == set(), edit
    nb = copy.deepcopy(master)  # two cells with one id: which is which cannot be told
    nb.cells.append(copy.deepcopy(next(c for c in nb.cells if c.id == "cell-05")))
    assert _skips(nb, master) == set()
    # the graded-checks cell passes globals() by design: read-only, its source is the release's
    assert skipping.marked(master) and _skips(master, master) == skipping.marked(master)


def test_a_marked_cell_the_student_rewrote_to_define_a_helper_runs():
    master = _masters()["02_data_loading"]
    nb = copy.deepcopy(master)
    demo = next(c for c in nb.cells if c.id == "cell-09")
    demo.source += "\n\ndef _crop(x):\n    return x\n"
    _cell(nb, "make_fast_loader").source += "\n\n_CROP = _crop\n"
    assert "cell-09" not in _skips(nb, master)


@pytest.mark.parametrize("source, defines, reads", [
    ("def f(x):\n    y = x + z\n    return y\n", {"f"}, {"z"}),  # a function's locals and arguments are its own
    ("import torch.nn.functional as F\nclass A:\n    k = F.relu\n", {"F", "A"}, {"F"}),
    ("def g():\n    global G\n    G = 1\n", {"g", "G"}, set()),
    ("%time x = y\n", set(), {"get_ipython"}),  # a magic's code is a string to IPython: read as dynamic
])
def test_names_are_a_cells_globals(source, defines, reads):
    assert skipping.names(source) == (defines, reads)


def test_a_magic_in_a_cell_that_runs_runs_the_notebook_whole_and_a_marked_one_runs():
    master = _masters()["05_compile"]
    nb = copy.deepcopy(master)
    _cell(nb, "compile_inference").source += "\n%time _ = 1\n"
    assert _skips(nb, master) == set()
    nb = copy.deepcopy(master)
    next(c for c in nb.cells if c.id == "cell-14").source += "\n%time sizes = 1\n"
    assert _skips(nb, master) == skipping.marked(master) - {"cell-14"}
