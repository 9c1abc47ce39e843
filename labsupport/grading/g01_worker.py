"""01's worker side: the student's 01 functions called for 01's checks (:class:`Here`, which the
notebook's self-check calls in its own process), and what a worker may be asked of them
(:class:`Side`), its answers as plain data. No check and no expected answer: those are the
judge's (:mod:`.g01_profile`).
"""

from __future__ import annotations

from collections.abc import Callable
# Bound when labsupport is imported, before any student code runs (as measure's clock is): a
# notebook that later replaces time.sleep or time.perf_counter does not change the known workload.
from time import perf_counter as _clock
from time import sleep as _sleep

import torch

from .. import measure, pipeline, train
from . import StudentCodeError, student
from .watch import watched
from .rungs import Recipe, Rung

# What a labelled phase must hold (operators or labels starting inside it, by name, lower-cased):
# the work it names (the profile keeps these events; :mod:`.labelled` reads them). The forward and
# the backward hold the network's convolutions on the batch handed over (each convolution's input
# and weight shapes, as many as the network runs), and no convolution of theirs runs elsewhere in
# the step: a label around one token convolution, or around a small other network, or a forward
# whose result is thrown away while the step runs outside the labels, does not hold the step's.
# "data wait" and "host to device" may hold nothing (on a CPU the copy is nothing).
PHASE_WORK = {"forward": ("aten::conv2d",), "backward": ("aten::convolution_backward",),
              "optimizer": ("optimizer.step#", "_foreach_", "aten::add_", "aten::mul_", "aten::addcmul_",
                            "aten::lerp_")}

# The profile the check takes, as 01's profiler cell does with torch.profiler.schedule(wait=1,
# warmup=1, active=2): two calls not recorded, then two recorded, each its own ProfilerStep.
PROFILE_SKIPPED, PROFILE_RECORDED = 2, 2
# The operators whose input shapes tie a profile to the model and batch it was given (record_shapes):
# a convolution's input and weight; for its backward, aten's (grad_output, input, weight, ...).
SHAPED = {"aten::conv2d": (0, 1), "aten::convolution_backward": (1, 2)}


def _named(event) -> str:
    """An event's name as the checks read it: a convolution's with its input and weight shapes
    (``aten::conv2d [32, 3, 112, 112] [64, 3, 7, 7]``), cut to 120 characters."""
    name = str(event.name)
    if name in SHAPED:
        shapes = list(getattr(event, "input_shapes", None) or [])
        name += "".join(f" {list(shapes[i]) if i < len(shapes) else []}" for i in SHAPED[name])
    return name[:120]


def profile_labelled(fn: Callable, lab) -> dict:
    """``fn(batches, step)`` (the student's ``labelled_step``) called PROFILE_SKIPPED times, then
    PROFILE_RECORDED times under the profiler (:func:`measure.profiler`, with input shapes), each
    call a ``ProfilerStep#N`` as torch.profiler's schedule labels it, given the naive loader's
    batches and a fresh fp32 step of the lab's: ``{"events": [(name, is a record_function label,
    start µs, end µs)] of the recorded steps (:func:`_named`), "drawn": batches each call took,
    "ran": how many of the step's own Conv2d layers ran forward in each call, "unchanged": how many
    of its parameters each call left as they were, "parameters": how many it has}``."""
    step = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    source = pipeline.forever(pipeline.naive_loader(lab.profile, seed=lab.seed))
    taken, ran = [0], set()

    def batches():
        for batch in source:
            taken[0] += 1
            yield batch

    # The step's own layers, by identity: a deep copy of the model carries these hooks along, and
    # its layers, which are not these, count nothing.
    # (A function is copied by reference, its closure with it; a functools.partial would be deep-copied.)
    hooks = [_ran_hook(layer, ran) for layer in step.model.modules() if isinstance(layer, torch.nn.Conv2d)]
    fn = watched(fn, "labelled_step", "01", given=hooks[:1])  # the hooks are the check's, beneath the student's forward
    feed, parameters = batches(), list(step.model.parameters())
    drawn, layers_ran, unchanged = [], [], []

    def call():
        was, before = taken[0], [p.detach().clone() for p in parameters]
        ran.clear()
        fn(feed, step)
        measure.sync(lab.device)
        drawn.append(taken[0] - was)
        layers_ran.append(len(ran))
        unchanged.append(sum(torch.equal(a, p.detach()) for a, p in zip(before, parameters)))

    for _ in range(PROFILE_SKIPPED):
        call()
    with measure.profiler(lab.device, shapes=True) as prof:
        for i in range(PROFILE_RECORDED):
            with torch.profiler.record_function(f"ProfilerStep#{PROFILE_SKIPPED + i}"):
                call()
    # What the checks read, and no more: the host's operators and labels (not the GPU's kernels,
    # whose long names would crowd the judge's wire), labels and the operators that name work.
    keys = ("conv",) + tuple(k for work in PHASE_WORK.values() for k in work)
    events = [(_named(e), bool(e.is_user_annotation), float(e.time_range.start), float(e.time_range.end))
              for e in prof.function_events if e.device_type == torch.autograd.DeviceType.CPU
              and (e.is_user_annotation or any(k in str(e.name).lower() for k in keys))]
    return {"events": events, "drawn": drawn, "ran": layers_ran, "unchanged": unchanged,
            "parameters": len(parameters)}


def _ran_hook(layer: torch.nn.Module, ran: set):
    """A forward hook on ``layer`` that adds its id to ``ran`` when ``layer`` itself runs forward."""
    def hook(module, args, out):
        if module is layer:
            ran.add(id(layer))
    layer.register_forward_hook(hook)
    return hook


# What one profile of 01's labelled_step may send back (names cut to 120 characters, convolutions'
# with their shapes; the reference's: 45 at the tiny profile, 18 of them without shapes).
MAX_EVENT_NAMES, MAX_EVENTS = 400, 100_000  # 48 KB of names (the wire takes 64), 3.2 MB of rows


class _KnownWorkload:
    """A step of known duration (20 ms) whose first calls are slow (100 ms), as a real first
    training step is (allocator growth, autotuning, lazy initialisation). It sleeps rather than
    computes, and records how long each call really took: a timer is judged against the very
    calls it timed, so a sleep that wakes late on a busy machine moves both alike. It also records
    the time between calls (``gaps_ms``: after each call until the next began, the last until the
    timer returned): a timer's clock reads fall there, so a process descheduled between the call's
    own clock and the timer's moves the timer alone, and by no more than that gap."""

    def __init__(self, slow_calls: int):
        self.slow_calls, self.took_ms, self.gaps_ms, self._ended = slow_calls, [], [], None

    def __call__(self) -> None:
        start = _clock()
        if self._ended is not None:
            self.gaps_ms.append((start - self._ended) * 1000)
        _sleep(0.1 if len(self.took_ms) < self.slow_calls else 0.02)
        self._ended = _clock()
        self.took_ms.append((self._ended - start) * 1000)

    def returned(self) -> None:
        """The timer returned: the gap after the last call ends here."""
        if self._ended is not None:
            self.gaps_ms.append((_clock() - self._ended) * 1000)
            self._ended = None


def _record(work) -> dict[str, list[float]]:
    """A workload's record of its calls: ``took_ms`` (each call) and ``gaps_ms`` (after each one;
    the same length once the timer returned), empty for a workload that keeps none."""
    return {"took_ms": list(getattr(work, "took_ms", [])), "gaps_ms": list(getattr(work, "gaps_ms", []))}


THROUGHPUT_KEYS = ("images_per_s", "median_ms", "p50_ms", "p95_ms", "p99_ms")


def _timer_answer(got) -> dict[str, float]:
    """What ``measure_throughput`` returned, as the five numbers it must hold (else a StudentCodeError)."""
    missing = set(THROUGHPUT_KEYS) - set(got if isinstance(got, dict) else {})
    if missing:
        raise StudentCodeError(f"measure_throughput must return a dict with {', '.join(sorted(missing))}")
    try:
        return {key: float(got[key]) for key in THROUGHPUT_KEYS}
    except (TypeError, ValueError):
        raise StudentCodeError("measure_throughput must return numbers for "
                               f"{', '.join(THROUGHPUT_KEYS)}") from None


class Here:
    """The student's 01 functions, called in this process (the notebook's self-check); the grader's
    judge passes its own ``sides``, which calls them in the student's worker."""

    def __init__(self, namespace: dict, lab):
        self.namespace, self.lab = namespace, lab

    def timed_workload(self, workload: str, *, warmup: int, steps: int, samples: int) -> tuple[dict, dict, float]:
        """``measure_throughput`` on a workload (``"known"``: :class:`_KnownWorkload`; ``"none"``:
        a call that does nothing; ``"matmul"``: :func:`_queued_matmuls`): ``(what it returned, the
        workload's own record of its calls (:func:`_record`), the seconds the whole call took)``."""
        fn = watched(student(self.namespace, "measure_throughput", "01"), "measure_throughput", "01")
        work = {"known": lambda: _KnownWorkload(warmup), "none": lambda: _Nothing(),
                "matmul": lambda: _queued_matmuls(self.lab.device)}[workload]()
        start = _clock()
        got = fn(work, self.lab.device, warmup=warmup, steps=steps, samples_per_step=samples)
        if isinstance(work, _KnownWorkload):
            work.returned()
        return _timer_answer(got), _record(work), _clock() - start

    def focus(self, side: str | None) -> None:
        pass

    def diagnose(self, breakdowns: list[dict[str, float]]) -> list[str]:
        fn = watched(student(self.namespace, "diagnose", "01"), "diagnose", "01")
        return [_answer(fn(dict(b))) for b in breakdowns]

    def top_operators(self, case: str) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        """``top_operators`` on a profile taken now (``"crafted"``: :func:`_decoy_workload` on the CPU,
        top 3; ``"step"``: the naive step on the lab's device, top 5): ``(its answer, the profile's
        table: each operator and its self time in µs as the table counts it)``."""
        fn = watched(student(self.namespace, "top_operators", "01"), "top_operators", "01")
        device, n = (torch.device("cpu"), 3) if case == "crafted" else (self.lab.device, 5)
        averages = _profiled(_decoy_workload() if case == "crafted" else _naive_step(self.lab), device)
        got = fn(averages, device, n)
        try:
            got = [(str(name)[:200], float(ms)) for name, ms in list(got)[:50]]
        except (TypeError, ValueError):
            raise StudentCodeError(f"top_operators must return a list of (operator name, self ms) pairs, "
                                   f"largest first; it returned {type(got).__name__}") from None
        return got, [(e.key, float(_self_time_us(e, device))) for e in averages]

    def labelled_profile(self) -> dict:
        """``labelled_step`` profiled here (:func:`profile_labelled`)."""
        return profile_labelled(student(self.namespace, "labelled_step", "01"), self.lab)


def _answer(value) -> str:
    """A diagnosis as the judge compares it: the text of what ``diagnose`` returned (at most 80 characters)."""
    return value[:80] if isinstance(value, str) else f"<{type(value).__name__}>"


class _Nothing:
    """A call that does nothing (01's sync check off CUDA: the timer must still run and answer)."""

    def __call__(self) -> None:
        pass


def _queued_matmuls(device: torch.device) -> Callable[[], None]:
    """Work queued asynchronously on CUDA: the host returns long before the GPU is done."""
    a = torch.randn(4096, 4096, device=device)

    def work():
        for _ in range(16):
            a @ a
    return work


def _self_time_us(event, device: torch.device) -> float:
    """An operator's self time as the profiler's table counts it: on the device on CUDA, else on the CPU."""
    return event.self_device_time_total if device.type == "cuda" else event.self_cpu_time_total


def _decoy_workload() -> Callable[[], None]:
    """Work whose largest *total* times (a user label around everything, then aten::linear, which
    wraps the matrix product) are not its largest *self* times (aten::addmm, aten::mul)."""
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(256, 512, generator=g), torch.randn(512, 512, generator=g), torch.zeros(512)

    def work():
        with torch.profiler.record_function("## whole step ##"):
            for _ in range(4):
                y = torch.nn.functional.linear(x, w, b)
                for _ in range(20):
                    y = y * 1.0001
    return work


def _profiled(fn: Callable[[], object], device: torch.device, steps: int = 1):
    """``key_averages()`` of ``steps`` calls of ``fn``, after one unprofiled warm-up call."""
    fn()
    with measure.profiler(device) as prof:
        for _ in range(steps):
            fn()
        measure.sync(device)
    return prof.key_averages()


def _naive_step(lab) -> Callable[[], object]:
    """The lab's fp32 step on the naive loader's next batch (01's profiled step)."""
    step = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    return train.pipeline_step(pipeline.forever(pipeline.naive_loader(lab.profile, seed=lab.seed)), step)



class Side:
    """01 in the student's worker: each of their functions on what the judge sends, its answer
    as plain data (a profile's events as a number table and their names once each)."""

    ASKED = ("timed_workload", "diagnose", "top_operators", "labelled_profile")

    def __init__(self, namespace: dict, lab, *, student: bool):
        if not student:
            raise PermissionError("the baseline's worker holds no student code (01)")
        self.here = Here(namespace, lab)

    def timed_workload(self, *, workload: str, warmup: int, steps: int, samples: int) -> dict:
        """What ``measure_throughput`` returned, and the workload's record of each call (the judge
        times the request itself)."""
        got, record, _ = self.here.timed_workload(str(workload), warmup=int(warmup), steps=int(steps),
                                                  samples=int(samples))
        return {"got": got, **{key: times[:1000] for key, times in record.items()}}

    def diagnose(self, *, breakdowns: list) -> list[str]:
        return self.here.diagnose([{str(k): float(v) for k, v in b.items()} for b in breakdowns])

    def top_operators(self, *, case: str) -> dict:
        got, table = self.here.top_operators(str(case))
        return {"got": got[:50], "table": [(key[:120], us) for key, us in table[:400]]}

    def labelled_profile(self) -> dict:
        """Each event: its name's index, whether it is a label, start and end in µs."""
        profiled = self.here.labelled_profile()
        names = sorted({name[:120] for name, _, _, _ in profiled["events"]})[:MAX_EVENT_NAMES]
        index = {name: i for i, name in enumerate(names)}
        rows = [(index[name[:120]], float(label), start, end) for name, label, start, end in profiled["events"]
                if name[:120] in index][:MAX_EVENTS]
        return {"names": names, "tensors": [torch.tensor(rows, dtype=torch.float64).reshape(-1, 4)],
                **{key: [int(n) for n in profiled[key]] for key in ("drawn", "ran", "unchanged")},
                "parameters": int(profiled["parameters"])}


# --- 01's rung: the naive baseline, no student code -----------------------------------------------

RUNG = Rung(lambda code, lab, made: Recipe())  # the recipe every rung starts from
