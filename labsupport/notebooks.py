"""The lab's notebooks, in one registry: number, file, what the student writes, the rung it records.

Every other place that needs to know the notebooks reads this table: the results store (which
notebook records a stage), 06's ladder (the rungs and their order), the graded checks (which
module grades a notebook), the code carried forward (which names a notebook hands to the later
ones) and the instructor's ``calibrate`` (which solution cells it re-runs). A seventh notebook is
one more row here, a master in ``autograder/source/lab/`` and a module in ``labsupport/grading/``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Notebook:
    """One notebook of the lab."""

    number: str  # "02": the prefix of its file, its checks' ids and its results' stages
    file: str  # "02_data_loading.ipynb"
    title: str  # what it teaches, in a few words
    graded: tuple[str, ...]  # the names the student defines and the checks call (carried forward)
    stage: str | None = None  # the results-store stage it records for 06's ladder, if any
    rung: str | None = None  # that stage's label in the ladder
    change: str | None = None  # the one change its rung makes to the rung it builds on
    builds_on: str | None = None  # the stage that rung adds its change to (None for the baseline)


NOTEBOOKS: tuple[Notebook, ...] = (
    Notebook("01", "01_profile.ipynb", "profile ResNet-18 training",
             ("measure_throughput", "diagnose", "labelled_step", "top_operators"),
             "01-baseline", "baseline", "naive PIL loader in the training process, fp32, loss.item() every step"),
    Notebook("02", "02_data_loading.ipynb", "data loading", ("make_fast_loader",),
             "02-data", "+data loading", "your input pipeline (02): decode once, batched augmentation, "
             "asynchronous copies, no loss.item() every step", "01-baseline"),
    Notebook("03", "03_amp.ipynb", "automatic mixed precision", ("choose_precision", "amp_train_step"),
             "03-amp", "+AMP", "your precision choice and mixed-precision step (03)", "02-data"),
    Notebook("04", "04_checkpointing.ipynb", "gradient checkpointing and accumulation",
             ("checkpointed", "SEGMENTS", "accumulate_step"),
             "04-memory", "+memory (larger batch)", "your checkpointing (04), spent on a doubled batch",
             "03-amp"),
    # torch.compile cannot trace 04's checkpointing (a checkpoint with a context_fn raises
    # NotImplementedError in Dynamo, torch 2.14), so the compile rung builds on +AMP, beside +memory.
    Notebook("05", "05_compile.ipynb", "torch.compile",
             ("compile_inference", "break_even_steps", "COMPILE_TRAINING"),
             "05-compile", "+compile", "torch.compile of your mixed-precision training step", "03-amp"),
    Notebook("06", "06_report.ipynb", "the comparison report", ("assemble_ladder",)),
    # Inference, not training: no rung of the ladder; 06's report shows it in a section of its own.
    Notebook("07", "07_compression.ipynb", "pruning, int8 quantisation and distillation",
             ("prune_globally", "make_permanent", "quantize_int8", "distillation_loss")),
    # Optional and not graded: released with the others, neither collected nor graded.
    Notebook("08", "08_distributed.ipynb", "distributed data parallel (optional)", ()),
)

BY_NUMBER = {nb.number: nb for nb in NOTEBOOKS}


def get(number: str) -> Notebook:
    """The notebook numbered ``number`` ("02"), or a ValueError naming the known ones."""
    try:
        return BY_NUMBER[number]
    except KeyError:
        raise ValueError(f"No notebook {number!r}; the lab's notebooks are "
                         f"{', '.join(BY_NUMBER)}.") from None


def of(name: str) -> Notebook:
    """The notebook a check id or stage belongs to: "02-loader-speedup" and "02-data" are 02's."""
    return get(name.split("-", 1)[0])


def by_stage(stage: str) -> Notebook:
    """The notebook that records ``stage`` ("03-amp")."""
    return next(nb for nb in NOTEBOOKS if nb.stage == stage)


def rungs() -> tuple[Notebook, ...]:
    """The notebooks that record a rung of 06's ladder, in ladder order."""
    return tuple(nb for nb in NOTEBOOKS if nb.stage)
