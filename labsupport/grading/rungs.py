"""Each notebook's rung of 06's ladder, measured by the grader from the student's carried code.

A notebook records its rung in a cell the student can edit; the grader measures it again, from
the code the notebook's checks carried forward, into its own results store. 06's checks read only
that store, so a rung typed, edited or written by hand in the student's kernel is never graded.

Each grading module whose notebook records a rung (a ``stage`` in labsupport/notebooks.py) says
how it is built, as its ``RUNG`` (a :class:`Rung`); this module measures any of them the same
way, as the notebooks do (the same ``measure_rung``), and the judge drives the ones whose step
runs the student's code from outside (:mod:`.judging`, :mod:`.worker`). Today's rungs:

- 01: the naive baseline (naive loader, fp32 step, ``loss.item()`` every step);
- 02: the student's loader feeding the fp32 step;
- 03: their loader feeding their precision choice and mixed-precision step;
- 04: their checkpointing (``checkpointed``, ``SEGMENTS``) around their 03 step, at twice the batch;
- 05: their 03 step, compiled.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from collections.abc import Callable

from .. import notebooks, report, train
from . import CheckResult, carried, module_name, student


def measured(found: dict[str, CheckResult], check: str) -> float | None:
    """What ``check`` measured, if it ran (recorded beside a rung)."""
    result = found.get(check)
    return None if result is None else result.measured


@dataclass(frozen=True)
class Rung:
    """How the grader measures one notebook's rung (the notebook's grading module declares it as
    ``RUNG``)."""

    # (code, lab) -> (loader, step): code(number) is that notebook's graded code as a dict (this
    # notebook's own, or what an earlier one carried forward); lab is the rung's own.
    build: Callable[[Callable[[str], dict], object], tuple[object, train.TrainStep]]
    # (found, lab) -> what is recorded beside the rung, from this notebook's checks
    extras: Callable[[dict, object], dict] = lambda found, lab: {}
    in_worker: bool = False  # the step runs the student's code: in their worker, timed by the judge
    batch_factor: int = 1  # the rung's batch, in the profile's batches (04: twice, its point)
    counts_peak: bool = False  # the worker counts one step's peak memory (the rung's point is memory)
    compiled: bool = False  # the step is compiled (the worker starts Dynamo afresh first)


def of(number: str) -> Rung | None:
    """Notebook ``number``'s rung (None where it records none)."""
    if notebooks.get(number).stage is None:
        return None
    module = importlib.import_module(f".{module_name(number)}", __package__)
    if not isinstance(getattr(module, "RUNG", None), Rung):
        raise ValueError(f"notebook {number} records stage {notebooks.get(number).stage}, "
                         f"but {module.__name__} declares no RUNG")
    return module.RUNG


def rung_lab(rung: Rung, lab):
    """``lab`` at the rung's batch."""
    if rung.batch_factor == 1:
        return lab
    return dataclasses.replace(lab, profile=dataclasses.replace(
        lab.profile, batch_size=rung.batch_factor * lab.profile.batch_size))


def their_loader(code: Callable[[str], dict], lab):
    """The student's 02 loader (``make_fast_loader`` in ``code("02")``), built at ``lab``'s batch:
    what feeds every rung after the baseline."""
    return student(code("02"), "make_fast_loader", "02")(lab)


def code_of(namespace: dict, number: str, lab) -> Callable[[str], dict]:
    """The ``code(n)`` a rung is built from: ``namespace`` for notebook ``number``, what an earlier
    notebook's checks carried forward for the others."""
    return lambda n: namespace if n == number else vars(carried(n, lab))


def build(number: str, namespace: dict, lab) -> tuple[object, train.TrainStep, object]:
    """Notebook ``number``'s rung as ``(loader, step, the rung's lab)``."""
    rung = of(number)
    at = rung_lab(rung, lab)
    loader, step = rung.build(code_of(namespace, number, lab), at)
    return loader, step, at


def measure_timed(number: str, step: Callable[[], object], config: train.StepConfig, lab,
                  found: dict[str, CheckResult], wait: Callable[[], object] | None = None,
                  peak: Callable[[], float] | None = None) -> dict:
    """Record notebook ``number``'s rung timed from outside (the grader's judge): ``wait()`` fetches
    the next batch from the student's loader onto the device elsewhere, ``step()`` trains on it;
    each returns when it is done. Throughput as :func:`report.measure_rung` times it, and of the
    phases only the data wait (the fetch's time), which is all a clock outside can split off.
    Peak memory only the process running the step can count: where ``peak()`` asks it for one
    step's (04's rung, whose point is its memory), it is recorded as that process's count.
    ``lab``'s profile is the rung's (04's: twice the batch)."""
    import statistics
    import time

    from .. import measure, results

    nb = notebooks.get(number)
    profile = lab.profile
    whole = step if wait is None else (lambda: (wait(), step()))
    timing = measure.time_steps(whole, lab.device, warmup=profile.warmup_steps, steps=profile.measure_steps,
                                samples_per_step=profile.batch_size, progress=False)
    metrics = {**timing.summary()}
    if wait is not None:
        waits = []
        for _ in range(max(3, profile.measure_steps // 2)):
            started = time.perf_counter()
            wait()
            waits.append(1e3 * (time.perf_counter() - started))
            step()
        metrics["phases_ms"] = {"data wait": statistics.median(waits)}
    extra = of(number).extras(found, lab)
    if peak is not None:
        metrics.update(peak_bytes=float(peak()), peak_counted_by="the worker running the student's step")
    metrics.update(**extra, timed_by="the grader's judge, from outside", change=nb.change, builds_on=nb.builds_on)
    results.record(nb.stage, metrics, config=config, machine=lab.machine, profile=profile)
    return metrics


def measure(number: str, namespace: dict, lab, found: dict[str, CheckResult]) -> dict | None:
    """Measure and record notebook ``number``'s rung with the student's code (None where it has none).

    ``namespace`` holds the notebook's own graded functions; earlier notebooks' come from the
    results store (carried forward by their checks). ``found`` are this notebook's verdicts,
    whose measurements are recorded beside the rung. Raises whatever the student's code raises.
    """
    rung = of(number)
    if rung is None:
        return None
    loader, step, at = build(number, namespace, lab)
    return report.measure_rung(notebooks.get(number).stage, step, loader, lab, profile=at.profile,
                               progress=False, **rung.extras(found, at))
