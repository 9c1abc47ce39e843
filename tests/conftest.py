"""Shared fixtures: a tiny generated dataset and the tiny profile, so tests stay fast."""

import pytest
import torch

from labsupport import dataset
from labsupport.hardware import PROFILES


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A 10-class lab dataset with a few small images per class (not the real one)."""
    root = tmp_path_factory.mktemp("data") / "lab-shapes"
    return dataset.generate(root, seed=0, train_per_class=4, val_per_class=2, source_size=48,
                            progress=False)


@pytest.fixture
def tiny():
    return PROFILES["tiny"]


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="needs a CUDA GPU (run on a GPU machine to cover this)")
