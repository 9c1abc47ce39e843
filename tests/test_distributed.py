"""Notebook 08 (optional, not graded): DDP over gloo in 2 processes, run headless here.

The notebook asserts its own correctness partner (2 processes compute the gradients of 1 process
on the whole batch, with and without ``no_sync`` accumulation); this test runs it at the tiny
profile and reads what it printed. 08 takes the accumulation from the student's own 04.
"""


import nbformat
import pytest
import torch

from autograder import course, headless, reference
from labsupport import carry, distributed

MASTER = course.masters_dir() / "08_distributed.ipynb"


@pytest.mark.long
def test_the_distributed_notebook_runs_in_two_processes(tmp_path, tiny_data):
    nb = nbformat.read(MASTER, as_version=4)
    # 08's accumulation runs the student's accumulate_step from 04: here, the reference's, kept as
    # 04's checks keep a student's
    carry.keep("04", reference.namespace("04"), tmp_path / "results" / "code")
    env = {"LAB_RESULTS": str(tmp_path / "results"), "LAB_DATA": str(tiny_data), "LAB_PROFILE": "tiny"}
    with course.environment(env), course.venv_on_path():
        headless.execute(nb, tmp_path, timeout_s=300)
    printed = "".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))
    assert "2 processes, gradients: the gradients of 1 process on the whole batch" in printed
    assert "2 processes, gradients, 2 micro-batches, no_sync: the gradients of 1 process" in printed
    assert "scaling efficiency of 2 processes:" in printed
    assert "no_sync saves" in printed


def test_a_global_batch_that_does_not_split_evenly_is_refused():
    images, labels = torch.zeros(5, 3, 8, 8), torch.zeros(5, dtype=torch.long)
    with pytest.raises(ValueError, match="does not split evenly across 2 processes"):
        distributed.run(2, [distributed.Task("t")], images, labels)
