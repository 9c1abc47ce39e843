"""Scenario notebooks left out of the instructor batch, graded here as the grader grades them, but
without a kernel: exactly the scenario's code, exactly its points.

test_instructor.py grades every scenario end to end (kernel, carried code, verdict process,
gradebook) in one batch, which is most of make test's time. A notebook whose wrong code is a
scenario's point, and whose way through the kernel and the carry is already proven by the
reference's and other scenarios' notebooks, is left out of that batch (NOT_HANDED_IN there) and
graded here instead:

- the scenario's notebooks are built from the committed release and the masters, as for the batch
  (scenarios.from_checkout);
- the notebooks it hands in before this one are carried forward, as their checks would have kept
  them (what the later checks use: 03's precision and step, 05's compile);
- this notebook's graded solution cells run in a namespace, and are carried too; the checks run on
  the carried code in one process (the same checks the grader's judge runs against its workers,
  tests/test_judge.py);
- the test cells are scored as the grader scores them (deciding.score: its decision on each check a
  cell requires, from the measurement and this machine's bar), and the cells that
  score 0 must be exactly LOSES[scenario][notebook], the batch's own table.
"""

import pytest
import scenarios
from test_instructor import LOSES, NOT_HANDED_IN, POINTS

from autograder import course, deciding, reference
from labsupport import carry, grading

# The scenario notebooks graded here: (scenario, notebook). Each is in NOT_HANDED_IN.
UNBATCHED = (("honest-bugs", "04_checkpointing"), ("honest-bugs", "07_compression"),
             ("shortcuts", "04_checkpointing"), ("shortcuts", "07_compression"), ("variant", "02_data_loading"))


def test_every_notebook_graded_here_is_left_out_of_the_batch():
    assert all(notebook in NOT_HANDED_IN.get(scenario, ()) for scenario, notebook in UNBATCHED), UNBATCHED


@pytest.fixture(scope="module")
def built():
    """Every scenario of UNBATCHED, built as for the batch."""
    return {s: scenarios.from_checkout(s) for s in {s for s, _ in UNBATCHED}}


@pytest.mark.parametrize("scenario, notebook", UNBATCHED, ids=lambda v: v)
def test_scenario_notebook_loses_exactly_its_points(built, scenario, notebook, tiny_env):
    handed_in = built[scenario]
    for name in sorted(handed_in):  # the notebooks before this one, and this one, as their checks keep them
        if name <= notebook:
            number = name[:2]
            carry.keep(number, reference.execute(handed_in[name], number, f"{scenario} {name}"))
    lab = grading.grading_lab()
    number = notebook[:2]
    found = grading.run(number, dict(vars(carry.load(number, lab=lab))), lab=lab, keep=False)
    said = {"checks": {c: {"status": r.status, "reason": r.reason, "measured": r.measured, "note": r.note}
                       for c, r in found.items()}}
    _, passed = deciding.score(said, deciding.checks_by_cell(course.COURSE_ROOT)[notebook], lab.machine)
    assert set(passed) == set(POINTS[notebook])
    lost = {cell for cell, ok in passed.items() if not ok}
    notes = {c: f"{r.status}: {r.note}" for c, r in found.items()}
    assert lost == LOSES[scenario].get(notebook, set()), f"{scenario} {notebook}: lost {sorted(lost)}; {notes}"


def test_the_untouched_release_fails_every_check_of_its_own_self_check(tiny_env, monkeypatch):
    """What `nbgrader validate --invert` checks: the release as handed out earns no check in the
    self-check a student runs (no free points, no green table, before they wrote anything); and in
    a kernel the grader runs, where the checks are left to the grader, the same code carries forward
    and measures nothing there."""
    import linecache

    handed_out = scenarios.from_checkout("unchanged")
    lab = grading.grading_lab()

    def as_a_kernel_runs_it(name: str) -> dict:  # its solution cells in turn; one that raises stops there
        namespace = reference.execute(handed_out[name], name[:2], f"release {name}", cell_ids=())
        for cell in handed_out[name].cells:
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
                filename = f"<release {name}:{cell.get('id')}>"  # registered, as IPython does: carry reads it
                linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True), filename)
                try:
                    exec(compile(cell.source, filename, "exec"), namespace)
                except Exception:  # as under nbgrader: the error is the cell's, the next cell runs
                    pass
        return namespace

    for name in sorted(POINTS):
        number = name[:2]
        namespace = as_a_kernel_runs_it(name)
        found = grading.run(number, namespace, lab=lab, keep=False)
        assert found and all(r.status == "fail" for r in found.values()), (
            name, {c: (r.status, r.note[:80]) for c, r in found.items() if r.status != "fail"})
    monkeypatch.setenv(grading.MEASURED_BY_THE_GRADER, "1")
    namespace = as_a_kernel_runs_it("02_data_loading")
    namespace["__name__"] = "__main__"  # the kernel's own namespace, whose functions it defined
    found = grading.run("02", namespace, lab=lab)
    assert {r.status for r in found.values()} == {"n/a"} and all(r.note == grading.DEFERRED_NOTE for r in found.values())
    assert "def make_fast_loader" in (carry.code_dir() / "02.py").read_text()
