"""Timing you can trust: one path for steady-state step times, paired A/B speedups, phase breakdowns.

The rules this module encodes, each a bug the lab teaches:

- **Warm up first.** The first steps pay for allocator growth, cuDNN autotuning, lazy init and
  compilation; they are run and thrown away.
- **Synchronise.** CUDA kernels run asynchronously: a host clock read right after a launch
  measures the launch, not the work. On CUDA, step times come from CUDA events recorded around
  each step (read after one final synchronise, so steps still overlap as they would in training);
  host-clock timings synchronise before each clock read.
- **Report a distribution.** Median and interquartile range, plus p50/p95/p99, never one run.
- **Compare in pairs.** This machine's speed drifts (turbo, other tenants, thermal). A speedup is
  the median of per-round ratios from interleaved rounds (A B, B A, A B, ...), so both sides see
  the same drift.

``torch.utils.benchmark.Timer.blocked_autorange`` follows the same rules, but it reports the mean
of blocks of calls; a training step is long enough to time one at a time, and we want its
per-step percentiles, so steady-state timing is done here with the same care.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

# Below this module, re-exported as ls.measure.X: profiles and their phases, a steady heap, undisturbed blocks.
from .profiling import _gpu_sampler, profiler, trace_phases  # noqa: F401
from .steady import BLOCK_TRIES, Disturbed, steady_heap, verified  # noqa: F401

# The clock and device synchronisation every timing uses, bound when labsupport is imported: a
# student's function that later replaces time.perf_counter or torch.cuda.synchronize (to shrink a
# measured time) cannot change what these names call. The grader's verdict process imports
# labsupport before it loads any student code.
from time import perf_counter as _clock  # noqa: E402

_cuda_synchronize = torch.cuda.synchronize
_mps_synchronize = torch.mps.synchronize


def sync(device: torch.device | str) -> None:
    """Wait for the device to finish queued work."""
    device = torch.device(device)
    if device.type == "cuda":
        _cuda_synchronize(device)
    elif device.type == "mps":
        _mps_synchronize()


@dataclass(frozen=True)
class Spread:
    """Median and spread of a sample."""

    median: float
    q1: float  # 25th percentile
    q3: float  # 75th percentile
    low: float  # minimum
    high: float  # maximum
    n: int

    @classmethod
    def of(cls, values) -> Spread:
        v = np.asarray(values, dtype=float)
        if v.size == 0:
            raise ValueError("Cannot summarise an empty sample: measure at least one step.")
        q1, med, q3 = np.percentile(v, [25, 50, 75])
        return cls(float(med), float(q1), float(q3), float(v.min()), float(v.max()), int(v.size))

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def __str__(self) -> str:
        return f"{self.median:.3g} (IQR {self.q1:.3g}-{self.q3:.3g}, n={self.n})"


@dataclass(frozen=True)
class StepTimes:
    """Per-step wall times of a steady-state run."""

    times_ms: tuple[float, ...]  # one entry per measured step, in order
    samples_per_step: int  # images one step consumes (batch size x accumulation steps)
    method: str  # "cuda-events" or "host-clock"
    threads: int  # torch intra-op threads during the run

    @property
    def ms(self) -> Spread:
        return Spread.of(self.times_ms)

    @property
    def median_ms(self) -> float:
        return self.ms.median

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.times_ms, q))

    @property
    def samples_per_s(self) -> float:
        """Throughput at the median step time."""
        return self.samples_per_step / (self.median_ms / 1000)

    def summary(self) -> dict:
        """Flat numbers for the results store and tables."""
        s = self.ms
        return {"samples_per_s": self.samples_per_s, "median_ms": s.median, "iqr_ms": s.iqr,
                "p50_ms": self.percentile_ms(50), "p95_ms": self.percentile_ms(95),
                "p99_ms": self.percentile_ms(99), "steps": s.n, "timing": self.method}


def time_steps(step: Callable[[], object], device: torch.device | str, *, warmup: int,
               steps: int, samples_per_step: int = 1, progress: bool = False) -> StepTimes:
    """Time ``steps`` calls of ``step`` after ``warmup`` discarded ones.

    This is the lab's one steady-state timing path.
    """
    device = torch.device(device)
    for _ in range(warmup):
        step()
    sync(device)
    loop = range(steps)
    if progress:
        from tqdm.auto import tqdm
        loop = tqdm(loop, desc="timing steps", leave=False)
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(steps)]
        for _, (start, end) in zip(loop, events):
            start.record()
            step()
            end.record()
        sync(device)
        times = [start.elapsed_time(end) for start, end in events]
        method = "cuda-events"
    else:
        times = []
        for _ in loop:
            t0 = _clock()
            step()
            sync(device)
            times.append((_clock() - t0) * 1000)
        method = "host-clock"
    return StepTimes(tuple(times), samples_per_step, method, torch.get_num_threads())


def micro(fn: Callable[[], object], label: str, *, min_run_time_s: float = 0.5):
    """Time a short function (an augmentation, a kernel) with ``torch.utils.benchmark``.

    For calls far shorter than a training step, ``Timer.blocked_autorange`` is the right tool:
    it warms up, picks a block size so that clock overhead vanishes, synchronises CUDA, and
    reports the median and IQR of per-call means. It runs with this process's torch thread
    count (``torch.get_num_threads()``), the count the training step itself uses. Returns a
    ``torch.utils.benchmark.Measurement`` (``.median`` and ``.iqr`` in seconds); a list of them
    prints as a table through ``torch.utils.benchmark.Compare``.
    """
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, label=label,
                            num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time_s)


# The matmul of the peak microbenchmark: large enough to run near a device's peak, small enough
# that a CPU measures it in a second (a 2048 x 2048 x 2048 matmul is 17 GFLOP).
PEAK_MATMUL_N = {"cuda": 8192, "mps": 4096, "cpu": 1024}


def matmul_peak(device: torch.device | str, dtype: torch.dtype = torch.float32, *, n: int | None = None,
                min_run_time_s: float = 0.5) -> Spread:
    """FLOP/s that one ``n x n`` matmul in ``dtype`` reaches on ``device``: the achievable peak a
    step's FLOP/s is read against.

    Timed with :func:`micro` (``torch.utils.benchmark``): the median and spread of its blocks'
    per-call times, as FLOP/s (2 n^3 per matmul). On CUDA it runs with torch's settings as they
    are: float32 matmuls in TF32 only where ``torch.backends.cuda.matmul.fp32_precision`` says so.
    A dense matmul is the best case: a convolution network's own kernels reach less of it.
    """
    device = torch.device(device)
    n = n or PEAK_MATMUL_N.get(device.type, 1024)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    m = micro(lambda: torch.mm(a, b), f"{n}x{n} matmul, {dtype}", min_run_time_s=min_run_time_s)
    flop = 2 * n ** 3
    per_s = [flop / t for t in m.times]
    return Spread.of(per_s)


def one_off_s(fn: Callable[[], object], device: torch.device | str) -> float:
    """Wall seconds of one call, synchronised before both clock reads.

    For things that happen once: compile time, first-step latency, an epoch.
    """
    device = torch.device(device)
    sync(device)
    t0 = _clock()
    fn()
    sync(device)
    return _clock() - t0


def cold_compile_s(compiled: Callable, *args, device: torch.device | str) -> float:
    """Seconds of the first call of a freshly compiled function, with the graph caches off.

    The caller runs ``torch.compiler.reset()`` first (Dynamo forgets what it compiled), and the
    FX graph and autotuning caches are off here, so tracing, lowering and autotuning all happen
    again. Inductor's on-disk cache of already-built C++/Triton kernels stays on (it cannot be
    switched off per call), so a repeated compile on one machine is faster than the very first
    one there: 05 reports both.
    """
    from torch._inductor import config as inductor_config

    with inductor_config.patch(fx_graph_cache=False, autotune_local_cache=False):
        return one_off_s(lambda: compiled(*args), device)


@dataclass(frozen=True)
class Comparison:
    """A paired A/B speed comparison."""

    baseline_s: tuple[float, ...]  # seconds the baseline took, per round
    candidate_s: tuple[float, ...]  # seconds the candidate took, per round
    steps_per_round: int

    @property
    def ratios(self) -> tuple[float, ...]:
        """Per-round speedups: baseline time / candidate time (above 1 means faster)."""
        return tuple(b / c for b, c in zip(self.baseline_s, self.candidate_s))

    @property
    def speedup(self) -> Spread:
        return Spread.of(self.ratios)

    @property
    def noisy(self) -> bool:
        """True when the per-round ratios disagree by more than 15% (IQR / median).

        On a quiet machine the IQR is a few percent. Sustained load from another program (a
        second benchmark, a browser tab, an install) on a 2-core machine spreads the ratios far
        wider, and no statistic recovers the truth from that: close it and measure again.
        """
        s = self.speedup
        return s.iqr / s.median > 0.15

    def summary(self) -> dict:
        s = self.speedup
        per_step = 1000 / self.steps_per_round
        return {"speedup": s.median, "speedup_q1": s.q1, "speedup_q3": s.q3,
                "speedup_low": s.low, "speedup_high": s.high, "rounds": s.n,
                "baseline_ms": float(np.median(self.baseline_s)) * per_step,
                "candidate_ms": float(np.median(self.candidate_s)) * per_step,
                "noisy": self.noisy}

    def __str__(self) -> str:
        warning = " (NOISY: is something else running? measure again)" if self.noisy else ""
        return f"speedup {self.speedup} over {self.speedup.n} interleaved rounds{warning}"


def compare(baseline: Callable[[], object], candidate: Callable[[], object],
            device: torch.device | str, *, rounds: int, steps_per_round: int, warmup: int = 1,
            progress: bool = False, focus: Callable[[str], None] | None = None,
            overhead_s: float = 0.0, verify: Callable[[str], Callable[[], str]] | None = None) -> Comparison:
    """Speedup of ``candidate`` over ``baseline``, measured in interleaved rounds.

    Each round times ``steps_per_round`` calls of each side; the order alternates (A B, then
    B A) so that neither side always runs on a warmer or cooler machine. ``focus``, if given, is
    called with ``"baseline"`` or ``"candidate"`` before that side runs, off the clock (the
    grader's judge stops the other side's worker there). ``overhead_s``: what each call of
    either side costs besides its work, measured apart (the grader's judge: a batch's crossing
    from a worker), taken off both sides' times; a side never counts less than a tenth of its time.
    ``verify``: each timed block is kept only if it says so (:func:`verified`; the grader's judge:
    the stopped side used no CPU meanwhile), else timed again, then :class:`Disturbed`.
    """
    device = torch.device(device)
    focus = focus or (lambda side: None)
    for _ in range(warmup):
        focus("baseline")
        baseline()
        focus("candidate")
        candidate()

    def timed(fn: Callable[[], object]) -> float:
        side = "baseline" if fn is baseline else "candidate"
        focus(side)
        return verified(lambda: block(fn), side, verify)

    def block(fn: Callable[[], object]) -> float:
        sync(device)
        t0 = _clock()
        for _ in range(steps_per_round):
            fn()
        sync(device)
        took = _clock() - t0
        return max(took - overhead_s * steps_per_round, took / 10)

    loop = range(rounds)
    if progress:
        from tqdm.auto import tqdm
        loop = tqdm(loop, desc="paired rounds", leave=False)
    base_s, cand_s = [], []
    for r in loop:
        if r % 2 == 0:
            base_s.append(timed(baseline))
            cand_s.append(timed(candidate))
        else:
            cand_s.append(timed(candidate))
            base_s.append(timed(baseline))
    return Comparison(tuple(base_s), tuple(cand_s), steps_per_round)


class PhaseClock:
    """Stamps the phases of a step with a host clock, synchronising at each mark.

    Synchronising at every phase boundary removes the overlap a free-running step has, so the
    phases add up to a bit more than a real step: use the breakdown for *shares*, and
    :func:`time_steps` for speed.
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.totals_s: dict[str, float] = defaultdict(float)
        self._last = 0.0

    def start(self) -> None:
        sync(self.device)
        self._last = _clock()

    def mark(self, phase: str) -> None:
        """Charge the time since the previous mark to ``phase`` (accumulates within a step)."""
        sync(self.device)
        now = _clock()
        self.totals_s[phase] += now - self._last
        self._last = now


@dataclass(frozen=True)
class Utilisation:
    """How busy the device was while a function ran, sampled."""

    what: str  # what was sampled, in words
    percent: float | None  # the mean of the samples (None: nothing could be sampled here)
    samples: int
    note: str = ""  # why nothing was sampled, or how to read the number


def utilisation(fn: Callable[[], object], device: torch.device | str, *, interval_s: float = 0.1) -> Utilisation:
    """Sample how busy ``device`` is, every ``interval_s``, while ``fn()`` runs.

    On CUDA: the GPU utilisation that ``nvidia-smi`` shows, the share of each sample period in
    which *any* kernel ran (one small kernel on one of 100+ SMs counts as busy). On a CPU: the
    share of this machine's cores that this process kept busy (psutil), which is the CPU's
    nearest stand-in: it says the cores worked, not whether on the model or on decoding JPEGs.
    """
    import threading

    device = torch.device(device)
    if device.type == "cuda":
        try:
            read, source = _gpu_sampler(device)
        except Exception as err:
            return Utilisation("GPU utilisation", None, 0, f"could not read it ({type(err).__name__}: {err}); "
                               "pip install nvidia-ml-py, or check that nvidia-smi runs")
        what = f"GPU utilisation ({source})"
    elif device.type == "cpu":
        import os

        import psutil

        process, cores = psutil.Process(), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count()
        process.cpu_percent()  # starts psutil's interval: each later call covers the time since the last

        def read() -> float:
            return process.cpu_percent() / cores
        what = f"CPU: share of this process's {cores} cores kept busy (psutil)"
    else:
        return Utilisation(f"{device.type} utilisation", None, 0,
                           f"no utilisation counter is read on {device.type}; the data-wait share still is")
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(interval_s):
            try:
                samples.append(read())
            except Exception:  # one failed read loses one sample, not the measurement
                pass

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
        sync(device)
    finally:
        done.set()
        thread.join()
    if not samples:
        return Utilisation(what, None, 0, f"the run was shorter than one {interval_s} s sample")
    return Utilisation(what, float(np.mean(samples)), len(samples))
