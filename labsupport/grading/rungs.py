"""Each notebook's rung of 06's ladder, measured by the grader from the student's carried code.

A notebook records its rung in a cell the student can edit; the grader measures it again, from
the code the notebook's checks carried forward, into its own results store. 06's checks read only
that store, so a rung typed, edited or written by hand in the student's kernel is never graded.

The ladder is a loop. Each grading module whose notebook records a rung (a ``stage`` in
labsupport/notebooks.py) declares, as its ``RUNG`` (a :class:`Rung`), the one change its rung
makes to a :class:`Recipe` (a loader and a training step). A rung's recipe is the baseline's with
the changes of every rung along its chain (the registry's ``builds_on``) applied in turn; 06's
composed pipeline is the changes of every rung that buys speed, in ladder order. This module
measures any rung the same way, as the notebooks do (:mod:`labsupport.ladder` times a rung for
both), and the judge drives the ones whose step runs the student's code from outside
(:mod:`.judging`, :mod:`.worker`).
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

from .. import ladder, notebooks, pipeline, results, train
from . import CheckResult, StudentCodeError, carried


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
        config = dataclasses.replace(self.config, compile_backend=lab.profile.compile_backend) \
            if self.config.compiled else self.config
        return loader, train.make_step(config, lab.device, seed=lab.seed if seed is None else seed,
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
    """Notebook ``number``'s rung (None where it records none): declared beside what its worker
    builds (``gNN_worker``), which a worker imports without the notebook's checks."""
    if notebooks.get(number).stage is None:
        return None
    module = importlib.import_module(f".g{number}_worker", __package__)
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
    """Record notebook ``number``'s rung timed from outside (the grader's judge), with this
    notebook's checks' figures beside it: :func:`labsupport.ladder.measure_timed` (``wait()``
    fetches a batch, ``step()`` trains on it, ``peak()`` counts one step's peak where the rung's
    point is memory, ``verify`` keeps a block only where the stopped side did not run)."""
    return ladder.measure_timed(notebooks.get(number).stage, step, config, lab, extra=of(number).extras(found, lab),
                                wait=wait, peak=peak, verify=verify)


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
    return ladder.measure_rung(notebooks.get(number).stage, step, loader, lab, profile=at.profile,
                               progress=False, **rung.extras(found, at))


def measure_here(lab, stages) -> dict[str, str]:
    """Measure the rungs ``stages`` again on this machine, from the student's carried code, and
    record them; returns ``{stage: what happened}``. 06 calls it ``ls.paired.measure_here``.

    Rungs measured on different machines do not compare, and Colab gives every notebook a new
    runtime, often another machine: 06 measures each rung recorded elsewhere again here, exactly
    as the grader measures rungs (:func:`measure`: the naive baseline, or the code 02-05's
    checks carried forward). The new record keeps where the rung was first
    measured (``first_measured_on``) and the accuracy its first record held (03's training run,
    which is not repeated here); the figures 02-05's checks measured beside their rung were
    measured there, not here, and are left out.
    """
    done = {}
    for stage in stages:
        number = notebooks.by_stage(stage).number
        try:
            first = results.load(stage)
        except results.ResultsError:
            first = None
        try:
            namespace = {} if number == "01" else dict(vars(carried(number, lab)))
            measure(number, namespace, lab, {})
        except StudentCodeError as err:
            done[stage] = f"not measured again: {err}"
            continue
        except Exception as err:  # the carried code broke here: 06 says so and goes on
            done[stage] = f"not measured again: your carried code raised {type(err).__name__}: {str(err)[:200]}"
            continue
        if first is not None:
            record = results.load(stage)
            kept = {k: first["metrics"][k] for k in ("accuracy", "accuracy_fp32")
                    if first["metrics"].get(k) is not None}
            results.record(stage, {**record["metrics"], **kept,
                                   "first_measured_on": ladder.machine_label(first["machine"])},
                           config=record["config"], machine=record["machine"], profile=record["profile"])
        done[stage] = "measured again here"
    return done
