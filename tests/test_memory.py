"""Memory counts: a known allocation is detected exactly; saved activations match a hand count."""

import pytest
import torch
from torch import nn

from labsupport.memory import TensorBytes, peak_step_bytes, saved_activation_bytes
from conftest import requires_cuda

MB = 1_000_000


def test_cpu_peak_detects_a_known_allocation():
    report = peak_step_bytes(lambda: torch.empty(10 * MB, dtype=torch.float32), "cpu")
    assert report.peak_bytes == pytest.approx(40 * MB, rel=0.05)
    assert report.retained_bytes == 0 and report.method == "torch-dispatch"
    assert report.allocator_peak_bytes is None  # the allocator's figure is CUDA's alone


def test_cpu_peak_is_the_most_alive_at_once_not_the_sum():
    def fn():
        a = torch.empty(10 * MB, dtype=torch.uint8)
        del a
        b = torch.empty(6 * MB, dtype=torch.uint8)
        c = b.view(-1)[:100]  # a view allocates nothing
        b.add_(1)  # nor does an in-place op
        return c

    assert peak_step_bytes(fn, "cpu").peak_bytes == pytest.approx(10 * MB, rel=0.05)


def test_cpu_peak_sees_an_extra_allocation_inside_a_training_step():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))

    def step(extra_bytes=0):
        hold = torch.empty(extra_bytes, dtype=torch.uint8)  # alive for the whole step
        nn.functional.cross_entropy(net(x), y).backward()
        return hold

    step()
    plain = peak_step_bytes(step, "cpu").peak_bytes
    extra = peak_step_bytes(lambda: step(50 * MB), "cpu").peak_bytes
    assert extra - plain == pytest.approx(50 * MB, rel=0.05), (
        f"an extra 50 MB held during the step raised the peak by {(extra - plain) / MB:.1f} MB")


def test_tensors_that_existed_before_do_not_count():
    before = torch.ones(MB)
    with TensorBytes() as counter:
        before.mul_(2)
        view = before[10:]
    assert counter.peak_bytes == 0 and view.numel() == MB - 10


def test_saved_activation_bytes_match_a_hand_count():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.ReLU(), nn.Flatten(),
                        nn.Linear(4 * 8 * 8, 10))
    x = torch.randn(2, 3, 8, 8)
    # By hand: the conv saves its input x (2*3*8*8 floats) to compute the weight gradient; ReLU
    # saves its output (2*4*8*8 floats); Linear saves its input, a flattened *view* of that same
    # ReLU output (no new bytes); weights are parameters and do not count; sum() saves nothing.
    expected = (2 * 3 * 8 * 8 + 2 * 4 * 8 * 8) * 4
    assert saved_activation_bytes(lambda: net(x).sum(), net) == expected


def test_bf16_autocast_halves_activations_and_weight_casts_do_not_count():
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.ReLU(),
                        nn.Conv2d(8, 8, 3, padding=1, bias=False))
    x = torch.randn(2, 3, 16, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = saved_activation_bytes(lambda: net(x).sum(), net)
    # By hand: conv1 saves the bf16 cast of x, ReLU its bf16 output (which conv2 saves too),
    # 2 bytes each. The bf16 copies of the two weights are saved as well, but they are casts
    # of parameters, not activations.
    assert bf16 == (2 * 3 * 16 * 16 + 2 * 8 * 16 * 16) * 2
    fp32 = saved_activation_bytes(lambda: net(x).sum(), net)
    assert fp32 == 2 * bf16


def test_a_step_that_frees_last_steps_gradients_peaks_as_one_that_had_none():
    """The peak is counted the same way on every device (memory.TensorBytes): frees of tensors
    that existed before the call are not subtracted. CUDA's allocator counter (max allocated
    minus allocated at the start) would subtract them, so the plain step of 04, which first drops
    last step's gradients (zero_grad(set_to_none=True)), would peak lower by their size on a GPU
    than on a CPU, and 04's budget (a multiple of that peak) would mean something else there."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 16 * 16, 10))
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)  # no momentum: no state to allocate

    def step():
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()

    first = peak_step_bytes(step, "cpu").peak_bytes  # no gradients existed before
    grads = sum(p.numel() * p.element_size() for p in net.parameters())
    later = peak_step_bytes(step, "cpu").peak_bytes  # last step's gradients dropped first
    assert later == first, (first, later)
    assert later >= grads  # the new gradients are in the peak, the dropped ones not taken off


@requires_cuda
def test_cuda_peak_is_counted_as_on_the_cpu():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 16 * 16, 10))
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    peaks = {}
    for device in ("cpu", "cuda"):
        model, xd, yd = net.to(device), x.to(device), y.to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def step():
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(xd), yd).backward()
            optimizer.step()

        step()
        report = peak_step_bytes(step, device)
        assert report.method == "torch-dispatch"
        peaks[device] = report.peak_bytes
    assert peaks["cuda"] == pytest.approx(peaks["cpu"], rel=0.1), peaks


@requires_cuda
def test_04s_memory_snapshot_cell_keeps_the_snapshot_and_its_timeline(tmp_path, tiny_env):
    """04's CUDA-only cell, run as the notebook runs it: a snapshot pickle and its HTML timeline in
    results/memory, and max reserved at least max allocated."""
    from autograder import reference

    space = reference.namespace("04", cell_ids=("cell-03", "cell-budget", "cell-snapshot"))
    memory_dir = tmp_path / "results" / "memory"
    assert (memory_dir / "04-snapshot.pickle").stat().st_size > 0
    assert "<html" in (memory_dir / "04-snapshot.html").read_text().lower()
    assert torch.cuda.max_memory_reserved() >= torch.cuda.max_memory_allocated() > 0
    assert space["saved"] > 0 and space["param_bytes"] > 0


@requires_cuda
def test_cuda_reports_the_allocators_peak_beside_the_count():
    """The allocator's peak holds at least what the count saw (it rounds blocks up), for a known
    allocation."""
    report = peak_step_bytes(lambda: torch.empty(10 * MB, dtype=torch.float32, device="cuda"), "cuda")
    assert report.peak_bytes == pytest.approx(40 * MB, rel=0.05)
    assert report.allocator_peak_bytes >= report.peak_bytes
