"""How the judge sets up each notebook's checks: the ``JUDGED`` every graded notebook's grading
module declares (a :class:`Judged`), and what follows from it.

The grader reads it before a judge starts (which earlier notebooks' code to hand over, whether the
judge decides at all on this device class); the judge (:mod:`.judging`) reads it to start its workers.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from .. import notebooks
from . import module_name

# Every graded notebook of the registry (judges(): 02 and 06 not on every device).
NOTEBOOKS = tuple(nb.number for nb in notebooks.NOTEBOOKS if nb.graded)


MODEL_BYTES = 48 * 2**20  # a ResNet-18's state, in float32, with room to spare (a worker's buffer floor)


@dataclass(frozen=True)
class Judged:
    """How the judge sets up one notebook's checks: each graded notebook's grading module declares
    it as ``JUDGED``. The earlier notebooks' carried code its student worker loads beside its own
    is not declared: it follows from the rungs (:func:`.rungs.earlier_code`)."""

    # A worker of its own serves labsupport's baseline, which the student's code is compared with
    # (01 and 07 have none: their checks measure what they compare with themselves, in the judge).
    baseline: bool = False
    # The checks read the ladder (every rung recorded so far) and the report the kernel exported:
    # the grader hands the judge its own copies of both (``inputs/rungs``, ``inputs/report.html``).
    reads_ladder: bool = False
    composes: bool = False  # the checks build 06's composed pipeline (:func:`.rungs.pipeline_recipe`)
    buffer_floor: int = 0  # the least a worker's shared buffer holds (a model's state, a profile's events)
    # Device classes (profile prefixes) where a verdict process decides instead (:func:`judges`).
    not_on: tuple[str, ...] = ()
    # The checks whose measurement compares the two workers' timings, one side frozen while the
    # other is timed: not graded where the judge cannot freeze a side (:func:`unprotected`).
    compared: tuple[str, ...] = ()
    # The notebook's judge side (a :class:`RemoteSides`): what its checks ask of the workers, each
    # reply checked; None: they ask nothing of a worker beyond the judge's own :class:`.judging.Sides`.
    remote: type | None = None


class RemoteSides:
    """A notebook's judge side: the methods its checks call on ``sides`` (its ``Here``'s, in the
    notebook's self-check), each a request to a worker's ``Side`` (:mod:`.worker`) through the
    judge's :class:`.judging.Sides` (:meth:`~.judging.Sides.ask`), its reply checked as plain
    data; the rest (``focus``, ``verify``, ``checking``, ...) is the judge's own."""

    STANDS_IN: tuple[str, ...] = ()  # the student's functions the checks call directly: this side's method of that name

    def __init__(self, sides):
        self.sides = sides

    def __getattr__(self, name: str):
        if name == "sides":
            raise AttributeError(name)
        return getattr(self.sides, name)


def setup_of(number: str) -> Judged:
    """Notebook ``number``'s ``JUDGED``, from its grading module (a ValueError where it declares none)."""
    module = importlib.import_module(f".{module_name(number)}", __package__)
    if not isinstance(getattr(module, "JUDGED", None), Judged):
        raise ValueError(f"{module.__name__} declares no JUDGED (how the judge sets up notebook {number}'s checks)")
    return module.JUDGED


def earlier_code(number: str) -> tuple[str, ...]:
    """The earlier notebooks' carried code notebook ``number``'s student worker loads beside its own."""
    from . import rungs

    return rungs.earlier_code(number, composes=setup_of(number).composes)


def judges(number: str, profile: str) -> bool:
    """Whether the judge decides notebook ``number`` under ``profile``: every graded notebook,
    except where its ``JUDGED.not_on`` names the profile's class (today 02 on CUDA and 06 on GPUs;
    only losses, sampled updates, weights, logits, timings, profiler tables and 07's exported model
    as data cross; 05's judge's tests passed on an H200, the others' have not run on a GPU; 07 runs
    on the CPU on every class). On CUDA, 02's batches would cross to the judge through host memory
    (the lab's largest, 157 MB at 160 px), which no loader pays in a notebook; sharing them through
    CUDA IPC instead is not yet built. 06 grades a whole pipeline, whose asynchronous steps (no
    ``loss.item()`` every step) are part of what it measures, and every reply of a worker waits for
    its device (a timed call's update crosses on the clock): on a GPU that would take the overlap
    away from the student's pipeline."""
    if number not in NOTEBOOKS:
        return False
    off = setup_of(number).not_on
    return not (off and profile.startswith(off))


def unprotected(number: str, found: dict, why: str) -> str:
    """Where a side could not be frozen as a whole (``why``), fail every check of notebook
    ``number`` that compares the two sides' timings and was graded (a pass, or below its bar)
    with reason "not measured" (a SIGSTOP by pid list is no freeze: issue 60); the note it gets."""
    from dataclasses import replace

    note = (f"speed not graded: the judge could not freeze one side while it timed the other ({why}); "
            "the grader grades speed as root on a machine with cgroup v2")
    for check in setup_of(number).compared:
        result = found.get(check)
        if result is not None and result.reason in ("pass", "below bar"):
            found[check] = replace(result, status="fail", reason="not measured", note=f"{note}. {result.note}")
    return note


def order_problems() -> list[str]:
    """Rungs 06's ladder could never show: a notebook that records a rung, registered after a
    notebook whose checks read the ladder (``JUDGED.reads_ladder``: 06). Empty for a sound registry."""
    problems, readers = [], []
    for nb in notebooks.NOTEBOOKS:
        if nb.graded and setup_of(nb.number).reads_ladder:
            readers.append(nb.number)
        elif nb.stage and readers:
            problems.append(f"notebook {nb.number} records rung {nb.stage!r} after notebook "
                            f"{', '.join(readers)}, whose checks read the ladder: move its row (and its "
                            "number) before theirs in labsupport/notebooks.py")
    return problems


# What a judge's worker never has (design.md, contract 6: nothing importable where the student's
# code runs computes an expected answer): every graded notebook's checks, the correctness partners
# and the judge's own side. A worker imports its notebook's ``gNN_worker`` (what it builds, its
# rung) and labsupport's shared modules.
JUDGE_SIDE = ("partners.py", "judging.py", "verdict.py", "labelled.py")


def judge_only() -> tuple[str, ...]:
    """The files of labsupport/grading a judge's worker's copy of labsupport lacks."""
    return tuple(f"{module_name(number)}.py" for number in NOTEBOOKS) + JUDGE_SIDE


def worker_lab_copy(package, to):
    """labsupport (the package folder ``package``) copied into the folder ``to`` for a judge's
    workers: without :func:`judge_only`'s files, compiled caches or ``.pyc`` files (a cache would
    hold a removed module's code). Returns ``to``, the folder to put on the workers' PYTHONPATH."""
    import shutil
    from pathlib import Path

    to = Path(to)
    skipped = set(judge_only())

    def ignore(folder, names):
        here = Path(folder).name == "grading" and Path(folder).parent.name == "labsupport"
        return {n for n in names if n == "__pycache__" or n.endswith(".pyc") or (here and n in skipped)}
    shutil.copytree(package, to / "labsupport", ignore=ignore)
    return to
