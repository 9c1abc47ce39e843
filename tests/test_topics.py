"""labsupport.topics: each measured topic's helper, on tiny inputs (the notebooks read their tables)."""

from __future__ import annotations

import os
import warnings

import torch
from torch import nn

from labsupport import topics


def _tiny_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def test_one_adam_step_counted_leaves_12_bytes_per_fp32_parameter():
    """Gradients and Adam's two buffers are 12 bytes per fp32 parameter, byte for byte as counted
    (04's arithmetic, which the student writes and 04-training-memory grades)."""
    net = _tiny_net()
    parameters = sum(p.numel() for p in net.parameters())
    counted = topics.measured_training_bytes(net, torch.randn(2, 3, 8, 8), torch.tensor([1, 2]))
    assert counted["weights"] == 4 * parameters
    assert counted["gradients + state (retained)"] == 12 * parameters, counted
    assert counted["of which optimizer state"] == 8 * parameters
    assert counted["peak above weights"] >= counted["gradients + state (retained)"]


def test_layer_times_times_every_child_and_leaves_no_hook():
    net = _tiny_net()
    frame = topics.layer_times(net, torch.randn(2, 3, 8, 8), repeats=2)
    assert list(frame.index) == [name for name, _ in net.named_children()]
    assert (frame["ms"] >= 0).all() and frame.attrs["forward_ms"] > 0
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules()), "a hook was left behind"


def test_small_files_and_the_packed_file_read_the_same_samples(tmp_path):
    frame = topics.small_files_vs_packed(count=20, shape=(2, 2), folder=tmp_path)
    assert {"one file per sample", "one packed file (memmap)"} == set(frame.index.get_level_values(0))
    assert (frame["samples/s"] > 0).all()
    assert list(tmp_path.iterdir()) == [], "the temporary files are removed"


def test_thread_scaling_restores_threads_and_affinity():
    threads = torch.get_num_threads()
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    frame = topics.thread_scaling(n=64, min_run_time_s=0.01)
    assert frame["ms"].notna().all()
    assert torch.get_num_threads() == threads
    if cores is not None:
        assert os.sched_getaffinity(0) == cores


def test_an_export_computes_what_eager_does():
    frame = topics.exported_and_compared(_tiny_net(), torch.randn(2, 3, 8, 8), min_run_time_s=0.01)
    torch.testing.assert_close(torch.tensor(frame["max |difference|"].to_list()), torch.zeros(3), atol=1e-5, rtol=0)


def test_sdpa_matches_attention_by_hand_and_names_its_kernel():
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    by_hand = (q @ k.transpose(-2, -1) / 8 ** 0.5).softmax(-1) @ v
    torch.testing.assert_close(nn.functional.scaled_dot_product_attention(q, k, v), by_hand, atol=1e-5, rtol=1e-5)
    kernels = topics.attention_kernels(lambda: nn.functional.scaled_dot_product_attention(q, k, v), "cpu")
    assert kernels and all("attention" in k for k in kernels)
    with warnings.catch_warnings():  # a backend that cannot run here warns why before it raises
        warnings.simplefilter("ignore", UserWarning)
        frame = topics.sdpa_backends(q, k, v, min_run_time_s=0.01)
    assert frame.loc["MATH", "ms"] > 0
