"""Each notebook's rung of 06's ladder, measured by the grader from the student's carried code.

A notebook records its rung in a cell the student can edit; the grader measures it again, from
the code the notebook's checks carried forward, into its own results store. 06's checks read only
that store, so a rung typed, edited or written by hand in the student's kernel is never graded.

The ladder is a loop. Each grading module whose notebook records a rung (a ``stage`` in
labsupport/notebooks.py) declares, as its ``RUNG`` (a :class:`Rung`), the one change its rung
makes to a :class:`Recipe` (a loader and a training step). A rung's recipe is the baseline's with
the changes of every rung along its chain (the registry's ``builds_on``) applied in turn; 06's
composed pipeline is the changes of every rung that buys speed, in ladder order. This module
measures any rung the same way, as the notebooks do (the same ``measure_rung``), and the judge
drives the ones whose step runs the student's code from outside (:mod:`.judging`, :mod:`.worker`).
Today's changes:

- 01: the naive baseline (naive loader, fp32 step, ``loss.item()`` every step);
- 02: the student's loader instead of the naive one;
- 03: their precision choice and mixed-precision step;
- 04: their checkpointing (``checkpointed``, ``SEGMENTS``), at twice the batch (memory, not speed:
  not in 06's pipeline);
- 05: the step compiled (in 06's pipeline: as their ``COMPILE_TRAINING`` chose).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from collections.abc import Callable

from .. import notebooks, pipeline, report, train
from . import CheckResult, carried, module_name


def measured(found: dict[str, CheckResult], check: str) -> float | None:
    """What ``check`` measured, if it ran (recorded beside a rung)."""
    result = found.get(check)
    return None if result is None else result.measured


def _naive_loader(lab):
    return pipeline.naive_loader(lab.profile, seed=lab.seed)


@dataclass(frozen=True)
class Recipe:
    """A training pipeline as the ladder builds it, rung by rung: the baseline's (the naive loader
    feeding the lab's fp32 step) until a rung changes it."""

    loader: Callable[[object], object] = _naive_loader  # lab -> the loader, at that lab's batch
    config: train.StepConfig = train.StepConfig()
    update: Callable | None = None  # the student's update function (03's amp_train_step), or the lab's
    wrap: Callable | None = None  # model -> the network forward calls (04's checkpointing)
    notes: tuple[str, ...] = ()  # what a change could not do as asked (06's pipeline says it)

    def configured(self, **changes) -> Recipe:
        """This recipe with its step's config changed."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, **changes))

    def build(self, lab, *, seed: int | None = None) -> tuple[object, train.TrainStep]:
        """``(loader, step)`` at ``lab``: a fresh seeded ResNet-18 (``seed``, else the lab's)."""
        loader = self.loader(lab)
        return loader, train.make_step(self.config, lab.device, seed=lab.seed if seed is None else seed,
                                       update=self.update, wrap=self.wrap)


# (code, lab, recipe) -> recipe: code(number) is that notebook's graded code as a dict (this
# notebook's own, or what an earlier one carried forward); lab is the rung's own.
Change = Callable[[Callable[[str], dict], object, Recipe], Recipe]


@dataclass(frozen=True)
class Rung:
    """How the grader measures one notebook's rung (the notebook's grading module declares it as
    ``RUNG``)."""

    change: Change  # what this rung changes in the recipe of the rung it builds on
    # (found, lab) -> what is recorded beside the rung, from this notebook's checks
    extras: Callable[[dict, object], dict] = lambda found, lab: {}
    in_worker: bool = False  # the step runs the student's code: in their worker, timed by the judge
    batch_factor: int = 1  # the rung's batch, in the profile's batches (04: twice, its point)
    counts_peak: bool = False  # the worker counts one step's peak memory (the rung's point is memory)
    compiled: bool = False  # the step is compiled (the worker starts Dynamo afresh first)
    in_pipeline: bool = True  # in 06's composed pipeline (False: a rung that buys memory, not speed)
    # its change in 06's pipeline, where that differs (05: compiled only where the student chose to)
    pipeline_change: Change | None = None


def of(number: str) -> Rung | None:
    """Notebook ``number``'s rung (None where it records none)."""
    if notebooks.get(number).stage is None:
        return None
    module = importlib.import_module(f".{module_name(number)}", __package__)
    if not isinstance(getattr(module, "RUNG", None), Rung):
        raise ValueError(f"notebook {number} records stage {notebooks.get(number).stage}, "
                         f"but {module.__name__} declares no RUNG")
    return module.RUNG


def chain(number: str) -> tuple[notebooks.Notebook, ...]:
    """The notebooks whose changes make notebook ``number``'s rung: the baseline first, along the
    registry's ``builds_on``, ``number`` last."""
    nb = notebooks.get(number)
    out = [nb]
    while nb.builds_on:
        nb = notebooks.by_stage(nb.builds_on)
        out.insert(0, nb)
    return tuple(out)


def in_pipeline() -> tuple[notebooks.Notebook, ...]:
    """The notebooks whose changes make 06's composed pipeline: every rung that buys speed, in ladder order."""
    return tuple(nb for nb in notebooks.rungs() if of(nb.number).in_pipeline)


def recipe(number: str, code: Callable[[str], dict], lab) -> Recipe:
    """Notebook ``number``'s rung: the baseline, changed by every rung of its chain in turn."""
    made = Recipe()
    for nb in chain(number):
        made = of(nb.number).change(code, lab, made)
    return made


def pipeline_recipe(code: Callable[[str], dict], lab) -> Recipe:
    """06's composed pipeline: the baseline, changed by every rung that buys speed as its notebook
    chose, in ladder order, at ``lab``'s batch."""
    made = Recipe()
    for nb in in_pipeline():
        rung = of(nb.number)
        made = (rung.pipeline_change or rung.change)(code, lab, made)
    return made


def earlier_code(number: str, *, composes: bool = False) -> tuple[str, ...]:
    """The earlier notebooks whose carried code notebook ``number``'s checks build on: those whose
    rungs change its own rung's recipe (or, where it ``composes`` 06's pipeline, that pipeline's),
    the baseline aside (it holds no student code)."""
    if composes:
        return tuple(nb.number for nb in in_pipeline()[1:])
    if notebooks.get(number).stage is None:
        return ()
    return tuple(nb.number for nb in chain(number)[1:-1])


def rung_lab(rung: Rung, lab):
    """``lab`` at the rung's batch."""
    if rung.batch_factor == 1:
        return lab
    return dataclasses.replace(lab, profile=dataclasses.replace(
        lab.profile, batch_size=rung.batch_factor * lab.profile.batch_size))


def code_of(namespace: dict, number: str, lab) -> Callable[[str], dict]:
    """The ``code(n)`` a rung is built from: ``namespace`` for notebook ``number``, what an earlier
    notebook's checks carried forward for the others."""
    return lambda n: namespace if n == number else vars(carried(n, lab))


def build(number: str, namespace: dict, lab) -> tuple[object, train.TrainStep, object]:
    """Notebook ``number``'s rung as ``(loader, step, the rung's lab)``."""
    at = rung_lab(of(number), lab)
    loader, step = recipe(number, code_of(namespace, number, lab), at).build(at)
    return loader, step, at


def measure_timed(number: str, step: Callable[[], object], config: train.StepConfig, lab,
                  found: dict[str, CheckResult], wait: Callable[[], object] | None = None,
                  peak: Callable[[], float] | None = None,
                  verify: Callable[[str], Callable[[], str]] | None = None) -> dict:
    """Record notebook ``number``'s rung timed from outside (the grader's judge): ``wait()`` fetches
    the next batch from the student's loader onto the device elsewhere, ``step()`` trains on it;
    each returns when it is done. Throughput as :func:`report.measure_rung` times it, and of the
    phases only the data wait (the fetch's time), which is all a clock outside can split off.
    Peak memory only the process running the step can count: where ``peak()`` asks it for one
    step's (04's rung, whose point is its memory), it is recorded as that process's count.
    ``lab``'s profile is the rung's (04's: twice the batch). ``verify``: the timing and the waits are
    each one block, kept only where it says the baseline's worker, stopped, did not run
    (:func:`labsupport.measure.verified`)."""
    import statistics
    import time

    from .. import measure, results

    nb = notebooks.get(number)
    profile = lab.profile
    whole = step if wait is None else (lambda: (wait(), step()))
    timing = measure.verified(lambda: measure.time_steps(whole, lab.device, warmup=profile.warmup_steps,
                                                         steps=profile.measure_steps,
                                                         samples_per_step=profile.batch_size, progress=False),
                              "candidate", verify)
    metrics = {**timing.summary()}
    if wait is not None:
        def timed_waits() -> list[float]:
            waits = []
            for _ in range(max(3, profile.measure_steps // 2)):
                started = time.perf_counter()
                wait()
                waits.append(1e3 * (time.perf_counter() - started))
                step()
            return waits
        metrics["phases_ms"] = {"data wait": statistics.median(measure.verified(timed_waits, "candidate", verify))}
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
