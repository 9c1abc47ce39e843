"""The timing path: paired comparisons recover known ratios; step timing warms up and syncs."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from labsupport import measure, profiling
from conftest import requires_cuda


def _matmul_work(repeats: int):
    a = torch.randn(384, 384)
    out = torch.empty_like(a)

    def work():
        for _ in range(repeats):
            torch.mm(a, a, out=out)
    return work


def _compare_until_quiet(a, b, tries: int = 3) -> tuple[measure.Comparison, list[str]]:
    """compare(a, b), measured again while it says NOISY, as it advises: the first quiet result,
    or the last noisy one, with every noisy try described."""
    noisy = []
    for _ in range(tries):
        result = measure.compare(a, b, "cpu", rounds=11, steps_per_round=3, warmup=2)
        if not result.noisy:
            break
        noisy.append(str(result))
    return result, noisy


def test_paired_comparison_recovers_a_2x_workload():
    # Blocks of ~0.1 s: long enough that a burst of load from another process lands inside one
    # round's pair rather than on one side only. With a busy second process on 2 cores a try
    # measured 1.72x (IQR 1.37-2.42), flagged noisy: then only the direction is asserted. Beside
    # make test's instructor worker (three graders on 2 cores) a quiet try measured 2.24x (IQR
    # 2.08-2.36): a quiet result outside 2x +-10% is measured again, up to 3 times, as a noisy
    # one is. A comparison that is wrong (launches timed, sides swapped) misses every time.
    single, double = _matmul_work(40), _matmul_work(80)
    tries = []
    for _ in range(3):
        result, noisy = _compare_until_quiet(double, single)
        if result.noisy:
            assert result.speedup.median >= 1.3, f"twice the work measured no faster, even allowing for noise: {noisy}"
            return
        tries.append(str(result))
        if 1.8 <= result.speedup.median <= 2.2:
            return
    raise AssertionError("twice the work should measure as a 2x speedup (+-10%), got: " + "; ".join(tries))


def test_paired_comparison_of_a_workload_with_itself_is_one():
    """A against A: 1.0x within 5% when the rounds agree. When another process shares the cores,
    the rounds disagree and the comparison says NOISY; measuring again is what it advises. With a
    busy second process on a 2-core machine, tries measured 0.94x (IQR 0.80-1.05) and 1.18x (IQR
    0.99-1.64), each flagged noisy: no ratio near 1 means anything there, so after 3 noisy tries
    the test skips, visibly, rather than pass or fail on noise. Rounds that agree within the noisy
    flag's 15% can still put the median 6% off beside the rest of make test (1.06x, IQR
    0.98-1.14): as the 2x test above, a quiet try may miss and the next is measured; a comparison
    that is wrong (one side always first, launches timed) misses every time."""
    work = _matmul_work(40)
    tries = []
    for _ in range(3):
        result, noisy = _compare_until_quiet(work, work)
        if result.noisy:
            pytest.skip("this machine is busy: 3 comparisons in a row were flagged NOISY: " + "; ".join(noisy))
        if 0.95 <= result.speedup.median <= 1.05:
            return
        tries.append(str(result))
    raise AssertionError("A against A should be 1.0x (+-5%), got: " + "; ".join(tries))


def test_disagreeing_rounds_are_flagged_noisy():
    steady = measure.Comparison((2.0, 2.0, 2.02, 1.98), (1.0, 1.0, 1.0, 1.0), steps_per_round=1)
    assert not steady.noisy and "NOISY" not in str(steady)
    busy = measure.Comparison((2.0, 3.0, 1.2, 2.6), (1.0, 1.0, 1.0, 1.0), steps_per_round=1)
    assert busy.noisy and "NOISY" in str(busy) and busy.summary()["noisy"]


def test_paired_rounds_alternate_order():
    calls = []
    measure.compare(lambda: calls.append("A"), lambda: calls.append("B"), "cpu",
                    rounds=3, steps_per_round=1, warmup=0)
    assert "".join(calls) == "ABBAAB"


def test_an_overhead_measured_apart_comes_off_both_sides(monkeypatch):
    """compare's overhead_s (the judge's crossing of each batch from a worker) is taken off every
    call of both sides; a side never counts less than a tenth of its time (a call cheaper than its
    own crossing is not a speedup of thousands). A clock the calls advance makes it exact."""
    now = [0.0]
    monkeypatch.setattr(measure, "_clock", lambda: now[0])

    def costs(seconds):
        return lambda: now.__setitem__(0, now[0] + seconds)

    plain = measure.compare(costs(5.0), costs(2.0), "cpu", rounds=3, steps_per_round=4, warmup=0)
    assert plain.speedup.median == pytest.approx(2.5)
    less = measure.compare(costs(5.0), costs(2.0), "cpu", rounds=3, steps_per_round=4, warmup=0, overhead_s=1.0)
    assert less.speedup.median == pytest.approx(4.0)  # (5 - 1) / (2 - 1)
    floor = measure.compare(costs(5.0), costs(2.0), "cpu", rounds=3, steps_per_round=4, warmup=0, overhead_s=3.0)
    assert floor.speedup.median == pytest.approx(2.0 / 0.2)  # (5 - 3) / (2 / 10)


def test_a_block_its_verify_rejects_is_timed_again_then_the_comparison_gives_up(monkeypatch):
    """compare's ``verify`` (the grader's judge: the stopped side used no CPU meanwhile) sees every
    timed block: one it rejects is thrown away and timed again, and a block rejected in each of its
    BLOCK_TRIES tries ends the comparison with Disturbed, saying why; no figure of it counts."""
    now = [0.0]
    monkeypatch.setattr(measure, "_clock", lambda: now[0])
    calls, seen = [], []

    def costs(name, seconds):
        return lambda: (calls.append(name), now.__setitem__(0, now[0] + seconds))

    def verify(side, bad={"baseline": 1}):  # the baseline's first block is disturbed, once
        def done():
            seen.append(side)
            if bad.get(side):
                bad[side] -= 1
                now[0] += 100.0
                return "the other side ran"
            return ""
        return done

    cmp = measure.compare(costs("A", 5.0), costs("B", 2.0), "cpu", rounds=3, steps_per_round=1, warmup=0,
                          verify=lambda side: verify(side))
    assert "".join(calls) == "AABBAAB" and seen == ["baseline", "baseline", "candidate", "candidate",
                                                    "baseline", "baseline", "candidate"]
    assert cmp.speedup.median == pytest.approx(2.5) and max(cmp.baseline_s) == pytest.approx(5.0)
    with pytest.raises(measure.Disturbed, match=f"the other side ran .every one of {measure.BLOCK_TRIES} tries"):
        measure.compare(costs("A", 5.0), costs("B", 2.0), "cpu", rounds=3, steps_per_round=1, warmup=0,
                        verify=lambda side: lambda: "the other side ran" if side == "candidate" else "")


# A fresh process's malloc(20 MiB): from the heap, or a fresh mapping of its own (printed).
_WHERE_20_MIB = """
import ctypes, sys
from labsupport import measure, profiling
if sys.argv[1] == "steady" and not measure.steady_heap():
    print("no mallopt"); raise SystemExit
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
block = libc.malloc(20 * 2**20)
for line in open("/proc/self/maps"):
    low, high = (int(a, 16) for a in line.split()[0].split("-"))
    if low <= block < high:
        print("heap" if line.rstrip().endswith("[heap]") else "mapping")
"""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc (Linux)")
def test_a_steady_heap_serves_large_blocks_as_a_long_running_process_does():
    """After steady_heap() a fresh process serves a 20 MiB block from its heap (pages it keeps and
    reuses), where it otherwise maps fresh pages for it, faulted in on first touch."""
    def where(mode: str) -> str:
        return subprocess.run([sys.executable, "-c", _WHERE_20_MIB, mode], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parents[1]).stdout.strip()

    steady = where("steady")
    if steady == "no mallopt":
        pytest.skip("this C library has no glibc mallopt: steady_heap() does nothing here")
    assert (where("fresh"), steady) == ("mapping", "heap")


def test_time_steps_discards_warmup_and_reports_percentiles():
    calls = []

    def step():
        calls.append(1)
        time.sleep(0.02 if len(calls) <= 2 else 0.005)  # two slow "first" steps

    timing = measure.time_steps(step, "cpu", warmup=2, steps=10, samples_per_step=8)
    assert len(calls) == 12 and len(timing.times_ms) == 10
    assert 4.5 <= timing.median_ms < 15, f"warm-up steps leaked into the timing: {timing.ms}"
    assert timing.percentile_ms(50) <= timing.percentile_ms(95) <= timing.percentile_ms(99)
    assert timing.samples_per_s == pytest.approx(8 / (timing.median_ms / 1000))
    assert timing.summary()["timing"] == "host-clock"


def test_one_off_timing_measures_one_call():
    assert 0.045 <= measure.one_off_s(lambda: time.sleep(0.05), "cpu") < 0.2


def test_micro_benchmark_of_a_short_call():
    result = measure.micro(lambda: time.sleep(0.002), "sleep 2 ms", min_run_time_s=0.1)
    assert 0.0019 <= result.median < 0.01 and result.task_spec.num_threads == torch.get_num_threads()


def test_empty_sample_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one step"):
        measure.Spread.of([])


def test_phase_clock_accumulates_marks():
    clock = measure.PhaseClock("cpu")
    clock.start()
    time.sleep(0.01)
    clock.mark("forward")
    time.sleep(0.01)
    clock.mark("forward")
    assert clock.totals_s["forward"] >= 0.02


@requires_cuda
def test_cuda_step_times_include_asynchronous_work():
    a = torch.randn(4096, 4096, device="cuda")

    def launch_only():
        for _ in range(20):
            a @ a  # queued, not finished, when this returns

    synced = measure.one_off_s(launch_only, "cuda")
    timing = measure.time_steps(launch_only, "cuda", warmup=2, steps=5)
    assert timing.method == "cuda-events"
    assert timing.median_ms >= 0.5 * synced * 1000, "CUDA step times missed queued kernels"


def test_cpu_utilisation_tells_a_busy_process_from_an_idle_one():
    x = torch.randn(1500, 1500)
    busy = measure.utilisation(lambda: [x @ x for _ in range(60)], "cpu", interval_s=0.05)
    idle = measure.utilisation(lambda: time.sleep(0.5), "cpu", interval_s=0.05)
    assert "cores kept busy" in busy.what and busy.samples >= 3 and idle.samples >= 3
    # One thread (OMP_NUM_THREADS=1) is at most 50% of 2 cores; beside make test's other worker and
    # the graders it starts, it got 17% once (a fixed 20% bar failed). Busy must read well above
    # idle, and idle near nothing: a sampler that reads nothing, or the same number for both, fails.
    assert busy.percent > max(5.0, 5 * idle.percent) and idle.percent < 5, (busy, idle)


def test_gpu_utilisation_falls_back_to_nvidia_smi_without_nvml(monkeypatch):
    """The CUDA path's logic, on any machine: NVML unusable, one nvidia-smi query per sample."""
    import subprocess

    queries = []

    def nvml_missing(device=None):
        raise ModuleNotFoundError("nvidia-ml-py does not seem to be installed")

    def fake_smi(command, **kwargs):
        queries.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="57\n", stderr="")

    monkeypatch.setattr(torch.cuda, "utilization", nvml_missing)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(measure, "sync", lambda device: None)
    monkeypatch.setattr(subprocess, "run", fake_smi)
    found = measure.utilisation(lambda: time.sleep(0.35), "cuda", interval_s=0.05)
    assert found.what == "GPU utilisation (nvidia-smi --query-gpu=utilization.gpu)"
    assert found.percent == 57 and found.samples >= 3
    assert queries[0][:3] == ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]


def test_nvidia_smi_reads_the_gpu_torch_uses_by_its_uuid(monkeypatch):
    """Under CUDA_VISIBLE_DEVICES=3 torch's device 0 is nvidia-smi's 3: it is named by UUID."""
    import types

    uuid = "8a1f7c1e-0d5a-4b0e-9a57-1f2e3d4c5b6a"
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(uuid=uuid))
    assert profiling._nvidia_smi_id(0) == f"GPU-{uuid}"

    def no_properties(index):
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_properties)
    assert profiling._nvidia_smi_id(2) == "2"


def test_gpu_utilisation_that_cannot_be_read_says_why(monkeypatch):
    import subprocess

    def broken(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(torch.cuda, "utilization", broken)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(subprocess, "run", broken)
    found = measure.utilisation(lambda: None, "cuda")
    assert found.percent is None and "nvidia-smi" in found.note


@requires_cuda
def test_gpu_utilisation_reads_a_busy_gpu():
    a = torch.randn(4096, 4096, device="cuda")
    found = measure.utilisation(lambda: [a @ a for _ in range(400)], "cuda", interval_s=0.05)
    assert found.percent is not None and found.percent > 50, found


def _labelled_profile(device, wait_s=0.0, batch=8):
    """Two profiled steps of the lab's step with its five phases labelled, as 01 profiles them."""
    import time

    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from labsupport import train

    step = train.make_step(train.StepConfig(), device, seed=0)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

    def labelled():
        with record_function("data wait"):
            time.sleep(wait_s)
        with record_function("host to device"):
            images, labels = step.to_device(x, y)
        with record_function("forward"):
            loss = F.cross_entropy(step.model(images), labels)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            step.optimizer.step()
            step.optimizer.zero_grad()
        return loss.item()

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=2)) as prof:
        for _ in range(4):
            labelled()
            prof.step()
    return prof


def test_a_trace_read_per_phase_finds_the_idle_wait_and_the_operators_work():
    """01's optional trace reading: a 40 ms sleep in 'data wait' is idle time there, per step (two
    profiled steps averaged); forward and backward are mostly operators at work; on a CPU there
    are no copies to count."""
    reading = measure.trace_phases(_labelled_profile("cpu", wait_s=0.04))
    assert reading.attrs["device"] == "CPU operators"
    assert list(reading.index) == ["data wait", "host to device", "forward", "backward", "optimizer"]
    wait = reading.loc["data wait"]
    assert 40 <= wait["host ms"] < 80 and wait["busy ms"] == 0 and wait["kernels"] == 0
    for phase in ("forward", "backward"):
        row = reading.loc[phase]
        assert row["kernels"] >= 20 and 0.5 * row["host ms"] < row["busy ms"] <= row["host ms"] + 1e-6, row
    assert (reading["idle ms"] >= -1e-6).all() and reading["H2D copies"].isna().all()
    assert (reading["busy ms"] + reading["idle ms"] - reading["host ms"]).abs().max() < 1e-6


@requires_cuda
def test_a_gpu_trace_read_per_phase_counts_the_copies_and_the_kernels():
    reading = measure.trace_phases(_labelled_profile("cuda", wait_s=0.02, batch=64))
    assert reading.attrs["device"] == "GPU"
    assert reading.loc["host to device", "H2D copies"] >= 2  # images and labels, pageable
    assert reading.loc["data wait", "idle ms"] >= 15  # the GPU starves while the host sleeps
    assert reading.loc["forward", "kernels"] >= 20 and reading.loc["backward", "kernels"] >= 20
    assert reading["H2D ms"].sum() > 0
