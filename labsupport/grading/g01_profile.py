"""Graded checks of 01_profile: the student's timer, their diagnosis, and their profiler trace.

- ``01-throughput-error``: ``measure_throughput`` agrees with labsupport's timer on a known workload.
- ``01-throughput-sync``: on CUDA it times the kernels, not their launches.
- ``01-diagnose``: ``diagnose`` names the bottleneck of crafted breakdowns and of this machine's.
- ``01-trace``: ``labelled_step``, profiled by the check (:mod:`.labelled`), is a training step of
  the step it was given (one batch, that model's own convolution layers run, every one of its
  weights moved) whose profile holds convolutions. The trace file the student's cell exports is
  theirs to read in Perfetto; no file is graded (one is as easy to write as to record).
- ``01-phases-labelled``: that profile labels the five phases of one step with ``record_function``,
  in order, each around the work it names on the model and batch handed over (the forward every
  convolution of the network, by its input and weight shapes, the backward every
  ``convolution_backward``, none of them outside their label; the optimizer its update).

The student's functions are called under :func:`.watch.watched`: none may call the grader, and
``measure_throughput`` not labsupport's own timers.
- ``01-top-operators``: ``top_operators`` reads the operators taking the most self time from
  ``key_averages()``, as the profiler's own table sorts them, on a profile taken now.

Each check is written once, against ``sides``: :class:`Here` calls the student's functions in this
process (the notebook's self-check); the grader's judge passes its :class:`Remote`, which
calls them in the student's worker and gets back what they returned, as plain values. What the
checks measure themselves (this machine's phase breakdown, the CUDA reference timing) is measured
where the check runs: in the judge, by the judge; the profile of ``labelled_step`` is taken where
the step runs, and only its events come back.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .. import measure, pipeline, train
from . import StudentCodeError, judge, register, student
from .g01_worker import Here, _queued_matmuls, _self_time_us, _timer_answer  # noqa: F401 (re-exported)
from .judge_setup import Judged, RemoteSides
from .labelled import (PHASE_WORK, PROFILE_RECORDED, PROFILE_SKIPPED, model_convolutions,  # noqa: F401 (re-exported)
                       phases_holding_their_work, profile_labelled)
from .rungs import Recipe, Rung
from .watch import watched


@register("01-throughput-error")
def throughput(namespace, lab, sides=None):
    """The student's measure_throughput agrees with the calls it timed: their median, p95 and
    images/s, from the known workload's own record of each call (the warm-up calls left out).

    A timer's clock reads fall between calls, so each timed call took, by any right timer, at
    least what the workload recorded and at most that plus the gaps on either side of it (a
    process descheduled there, on a busy machine, moves the timer and not the record). Each
    figure is judged by how far it lies outside what those bounds allow (their percentiles).

    Where the record comes from the student's worker, it is checked against what a sleep can
    take: no call shorter than it sleeps, and the calls and gaps together no longer than the judge
    saw the request take."""
    student(namespace, "measure_throughput", "01")
    sides = sides or Here(namespace, lab)
    warmup, steps, samples = 3, 20, 32
    got, record, seconds = sides.timed_workload("known", warmup=warmup, steps=steps, samples=samples)
    took_ms, gaps_ms = record["took_ms"], record["gaps_ms"]
    if len(took_ms) != warmup + steps:
        raise StudentCodeError(f"measure_throughput called step {len(took_ms)} times; with warmup={warmup} "
                               f"and steps={steps} it calls it {warmup + steps} times (the first {warmup} untimed)")
    slept = [100.0] * warmup + [20.0] * steps
    if (any(not (t >= 0.98 * s) for t, s in zip(took_ms, slept)) or len(gaps_ms) != len(took_ms)
            or any(not (g >= 0) for g in gaps_ms) or sum(took_ms) + sum(gaps_ms) > 1000 * seconds + 1.0):
        raise StudentCodeError("the known workload's record of its calls is not what its sleeps can take "
                               f"(each at least {slept[-1]:.0f} ms, {sum(slept) / 1000:.2f} s in all; the call "
                               f"took {seconds:.2f} s): graded code must not change labsupport's workload")
    timed = range(warmup, warmup + steps)
    low = measure.StepTimes(tuple(took_ms[i] for i in timed), samples, "host-clock", torch.get_num_threads())
    high = measure.StepTimes(tuple(took_ms[i] + gaps_ms[i - 1] + gaps_ms[i] for i in timed), samples,
                             "host-clock", torch.get_num_threads())
    allowed = {"median_ms": (low.median_ms, high.median_ms),
               "p95_ms": (low.percentile_ms(95), high.percentile_ms(95)),
               "images_per_s": (high.samples_per_s, low.samples_per_s)}
    errors = {key: _outside(got[key], *bounds) for key, bounds in allowed.items()}
    worst = max(errors, key=lambda k: abs(errors[k]))
    note = (f"worst: {worst} off by {errors[worst]:+.0%} (the {steps} timed calls took: median "
            f"{low.median_ms:.1f} ms, p95 {low.percentile_ms(95):.1f} ms, {low.samples_per_s:.0f} images/s; "
            f"with the gaps around them up to p95 {high.percentile_ms(95):.1f} ms)")
    return [judge("01-throughput-error", abs(errors[worst]), lab, note=note)]


def _outside(value: float, low: float, high: float) -> float:
    """How far ``value`` lies outside ``[low, high]``, relative to the nearer bound (0 inside)."""
    if value < low:
        return value / low - 1
    return value / high - 1 if value > high else 0.0


@register("01-throughput-sync")
def throughput_sync(namespace, lab, sides=None):
    """On CUDA, measure_throughput times the kernels, not their launches (synchronises). The
    reference timing (CUDA events) is taken where the check runs, on the same work."""
    student(namespace, "measure_throughput", "01")
    sides = sides or Here(namespace, lab)
    if lab.device.type != "cuda":
        # Not applicable here, but the function must still run and answer (no free points).
        sides.timed_workload("none", warmup=1, steps=3, samples=1)
        return [judge("01-throughput-sync", None, lab)]
    sides.focus(None)
    ref = measure.time_steps(_queued_matmuls(lab.device), lab.device, warmup=3, steps=20)
    got, _, _ = sides.timed_workload("matmul", warmup=3, steps=20, samples=1)
    ratio = got["median_ms"] / ref.median_ms
    return [judge("01-throughput-sync", ratio, lab,
                          note=f"yours {got['median_ms']:.2f} ms vs CUDA events {ref.median_ms:.2f} ms")]


_GROUPS = {"data": ("data wait",), "transfer": ("host to device",), "compute": ("forward", "backward"),
           "optimizer": ("optimizer",)}

# Crafted breakdowns (ms per phase) with their bottleneck. Some need the grouping: the largest
# single phase is not always the bottleneck.
_CASES = [
    ({"data wait": 70, "host to device": 2, "forward": 10, "backward": 15, "optimizer": 3}, "data"),
    ({"data wait": 5, "host to device": 3, "forward": 30, "backward": 55, "optimizer": 7}, "compute"),
    ({"data wait": 20, "host to device": 45, "forward": 15, "backward": 15, "optimizer": 5}, "transfer"),
    ({"data wait": 40, "host to device": 1, "forward": 30, "backward": 28, "optimizer": 1}, "compute"),
    ({"data wait": 10, "host to device": 5, "forward": 12, "backward": 13, "optimizer": 60}, "optimizer"),
    ({"data wait": 0.7, "host to device": 0.01, "forward": 0.1, "backward": 0.15, "optimizer": 0.04}, "data"),
]


def _bottleneck(breakdown: dict[str, float]) -> str:
    return max(_GROUPS, key=lambda g: sum(breakdown.get(p, 0.0) for p in _GROUPS[g]))


@register("01-diagnose")
def diagnose(namespace, lab, sides=None):
    """diagnose() names the right bottleneck on crafted breakdowns and on this machine, measured now
    (by the check, where it runs: in the grader, by the judge)."""
    student(namespace, "diagnose", "01")
    sides = sides or Here(namespace, lab)
    sides.focus(None)
    step = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    batches = pipeline.forever(pipeline.naive_loader(lab.profile, seed=lab.seed))
    per_step = train.phase_breakdown(batches, step, steps=3, warmup=1)
    here = {p: float(np.median(v)) for p, v in per_step.items()}
    cases = [*_CASES, (here, _bottleneck(here))]
    answers = sides.diagnose([b for b, _ in cases])
    wrong = [(b, want, got) for (b, want), got in zip(cases, answers) if got != want]
    note = "; ".join(f"{({k: round(v, 1) for k, v in b.items()})} is {want!r}, you said {got!r}"
                     for b, want, got in wrong[:2])
    return [judge("01-diagnose", 1 - len(wrong) / len(cases), lab,
                          note=note or f"this machine, measured now: {cases[-1][1]}")]


@register("01-trace", "01-phases-labelled")
def trace(namespace, lab, sides=None):
    """The student's ``labelled_step``, profiled by the check (:func:`profile_labelled`): each call
    is a training step of the step it was given (one batch, its own model's convolutions run,
    every one of its parameters updated), its profiled steps hold convolutions, and it labels each
    phase of a step (train.PHASES) with record_function around the work that phase names, on the
    model and batch handed over (the operators' input shapes)."""
    student(namespace, "labelled_step", "01")
    sides = sides or Here(namespace, lab)
    profiled = sides.labelled_profile()
    events, drawn = profiled["events"], profiled["drawn"]
    ran, unchanged = profiled["ran"], profiled["unchanged"]
    expected = model_convolutions(lab.profile.batch_size, lab.profile.image_size)
    layers = sum(expected["forward"].values())
    wrong = "; ".join(filter(None, [
        any(n != 1 for n in drawn) and f"it took {drawn} batches from `batches` in its {len(drawn)} calls: "
                                       "one step takes one batch",
        any(n < layers for n in ran) and f"the model of the step it was given ran {ran} of its {layers} "
                                         "convolution layers in its calls: train `step.model` itself (not a "
                                         "copy of it, or another network)",
        any(unchanged) and (
            "the weights of the step it was given did not move: call `step.optimizer`'s step"
            if max(unchanged) == profiled["parameters"] else
            f"{max(unchanged)} of the {profiled['parameters']} parameters of the step's model did not change in a "
            "call: one step updates every weight of the step it was given, with `step.optimizer`'s step")]))
    convs = sum(1 for name, label, _, _ in events if not label and "conv" in name.lower())
    labelled, why = phases_holding_their_work(events, expected)
    return [judge("01-trace", convs, lab, correct=not wrong, why_incorrect=wrong,
                  note=f"your labelled_step, profiled by the check: {len(events)} events, {convs} of them "
                       "convolutions"),
            judge("01-phases-labelled", labelled, lab, correct=not wrong, why_incorrect=wrong,
                  note=why or "every phase of one step is labelled, in order, around the work it names, "
                              "on the model and batch handed over")]


# What each profile's table must hold, whoever took it: the crafted work's matrix product and
# multiplications, the step's convolutions (a table from the student's worker is its word).
_PROFILE_HOLDS = {"crafted": ("aten::addmm", "aten::mul"), "step": ("conv",)}


def _top_operators_problem(got: list[tuple[str, float]], table: list[tuple[str, float]], n: int, what: str) -> str:
    """Why ``got`` is not the top ``n`` of ``table`` (operator, self µs) by self time ("" if it is)."""
    want = sorted(table, key=lambda e: e[1], reverse=True)[:n]
    names = [key for key, _ in want]
    if [name for name, _ in got] != names:
        return f"{what}: the table's top {n} by self time are {names}, you named {[name for name, _ in got]}"
    for (name, ms), (_, us) in zip(got, want):
        table_ms = us / 1000
        if abs(ms - table_ms) > max(0.01 * table_ms, 1e-3):
            return f"{what}: {name} has {table_ms:.3f} ms of self time in the table, you said {ms:.3f} ms"
    return ""


@register("01-top-operators")
def top_operators(namespace, lab, sides=None):
    """top_operators() names the operators with the most self time, as key_averages() counts them,
    on a crafted profile (where total time ranks differently) and on the step, profiled now."""
    student(namespace, "top_operators", "01")
    sides = sides or Here(namespace, lab)
    problems = []
    for case, n, what in (("crafted", 3, "a crafted profile"), ("step", 5, "the naive step, profiled now")):
        got, table = sides.top_operators(case)
        keys = " ".join(key.lower() for key, _ in table)
        lacking = [k for k in _PROFILE_HOLDS[case] if k not in keys]
        if lacking:
            raise StudentCodeError(f"{what}: the profile holds no {', '.join(lacking)}: graded code must not "
                                   "change the profiler or labsupport's workloads")
        problems.append(_top_operators_problem(got, table, n, what))
    problems = [p for p in problems if p]
    return [judge("01-top-operators", 1 - len(problems) / 2, lab,
                  note="; ".join(problems) or "the profiler's top operators by self time, on both profiles")]


from .g01_worker import RUNG  # noqa: E402,F401 (its rung is declared beside what its worker builds)


class Remote(RemoteSides):
    """01's judge side: the student's functions called in their worker (:class:`~.g01_worker.Side`),
    each answer checked as plain data here."""

    def timed_workload(self, workload: str, *, warmup: int, steps: int, samples: int) -> tuple[dict, dict, float]:
        """:meth:`~.g01_worker.Here.timed_workload`'s answer; the seconds are the judge's, around the request."""
        started = time.perf_counter()
        reply = self.sides.ask("candidate", "timed_workload", workload=workload, warmup=warmup, steps=steps,
                               samples=samples).get("value")
        seconds = time.perf_counter() - started
        record = {key: reply.get(key) if isinstance(reply, dict) else None for key in ("took_ms", "gaps_ms")}
        if not all(isinstance(times, list) and all(isinstance(t, (int, float)) for t in times)
                   for times in record.values()):
            raise StudentCodeError("the workload's record of its calls did not come back")
        return _timer_answer(reply.get("got")), {k: [float(t) for t in v] for k, v in record.items()}, seconds

    def diagnose(self, breakdowns: list[dict]) -> list[str]:
        """The student's ``diagnose`` on each breakdown (each answer as text)."""
        from .workers import WorkerError

        answers = self.sides.ask("candidate", "diagnose", breakdowns=breakdowns).get("value")
        if not isinstance(answers, list) or len(answers) != len(breakdowns):
            raise WorkerError("diagnose's answers did not come back")
        return [str(a)[:80] for a in answers]

    def top_operators(self, case: str) -> tuple[list, list]:
        """The student's ``top_operators`` on a profile their worker takes now: its answer and the profile's table."""
        reply = self.sides.ask("candidate", "top_operators", case=case).get("value")
        try:
            got = [(str(name), float(ms)) for name, ms in reply["got"]]
            table = [(str(key), float(us)) for key, us in reply["table"]]
        except (KeyError, TypeError, ValueError):
            raise StudentCodeError("top_operators' answer or its profile did not come back as (name, time) pairs") from None
        return got, table

    def labelled_profile(self) -> dict:
        """The student's ``labelled_step`` profiled in their worker: the events, as names and a number table."""
        reply = self.sides.ask("candidate", "labelled_profile")
        value, tables = reply.get("value"), reply.get("tensors") or []
        value = value if isinstance(value, dict) else {}
        names, counts = value.get("names"), [value.get(key) for key in ("drawn", "ran", "unchanged")]
        if (not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(tables) != 1
                or tables[0].dim() != 2 or tables[0].shape[1] != 4 or not isinstance(value.get("parameters"), int)
                or not all(isinstance(c, list) and len(c) <= 16 and all(isinstance(n, int) for n in c) for c in counts)):
            raise StudentCodeError("the profile of labelled_step did not come back as events")
        events = []
        for i, label, start, end in tables[0].tolist():
            if not (0 <= i < len(names) and i == int(i)):
                raise StudentCodeError("the profile of labelled_step came back naming events it did not send")
            events.append((names[int(i)], bool(label), float(start), float(end)))
        return {"events": events, **dict(zip(("drawn", "ran", "unchanged"), counts)),
                "parameters": value["parameters"]}


# How the judge sets up 01's checks: no baseline worker (they measure the naive step themselves, and
# its rung is the naive step's); a worker's buffer holds a profile's events.
JUDGED = Judged(buffer_floor=4 * 2**20, remote=Remote)
