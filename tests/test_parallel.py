"""``grade --jobs N`` (autograder/parallel.py): how a machine's cores and GPUs are shared out.

That the parallel backend scores exactly as the serial one is proven by the instructor fixture,
which grades most scenarios two at a time (tests/test_instructor.py).
"""

from __future__ import annotations

import pytest
import torch

from autograder import course, parallel


def test_each_submission_gets_cores_of_its_own():
    got = parallel.slots(2, [0, 1, 2, 3, 4], [])
    assert [s.cores for s in got] == [(0, 1), (2, 3)]  # equal shares; the odd core is left idle
    assert all(s.gpu is None for s in got)
    assert [s.cores for s in parallel.slots(1, [3, 5], [])] == [(3, 5)]


def test_each_submission_gets_a_gpu_of_its_own():
    got = parallel.slots(2, list(range(16)), ["4", "6", "7"])
    assert [(s.cores, s.gpu) for s in got] == [(tuple(range(8)), "4"), (tuple(range(8, 16)), "6")]


@pytest.mark.parametrize("jobs, cores, gpus, says", [
    (3, [0, 1], [], "needs a core per submission"),
    (3, list(range(8)), ["0", "1"], "needs a GPU per submission"),
    (0, [0, 1], [], "at least one"),
])
def test_more_jobs_than_cores_or_gpus_is_refused(jobs, cores, gpus, says):
    with pytest.raises(course.CourseError, match=says):
        parallel.slots(jobs, cores, gpus)


def test_the_gpus_handed_out_are_the_visible_ones(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert parallel.visible_gpus() == ["3", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert parallel.visible_gpus() == ["0", "1"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert parallel.visible_gpus() == []
