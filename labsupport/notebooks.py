"""The lab's notebooks, in one registry: number, file, what the student writes, the rung it records.

Every other place that needs to know the notebooks reads this table: the results store (which
notebook records a stage), 06's ladder (the rungs and their order), the graded checks (which
module grades a notebook), the code carried forward (which names a notebook hands to the later
ones) and the instructor's ``calibrate`` (which solution cells it re-runs). A seventh notebook is
one more row here, a master in ``autograder/source/lab/`` and a module in ``labsupport/grading/``.

It also holds each notebook's times, in one place: the student's own work (``STUDENT_MINUTES``, one
sitting each) and the compute time on every device class (``COMPUTE``, measured or estimated), which
every notebook shows under its setup cell (:func:`sitting`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


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
             ("checkpointed", "SEGMENTS", "accumulate_step", "training_bytes"),
             "04-memory", "+memory (larger batch)", "your checkpointing (04), spent on a doubled batch",
             "03-amp"),
    # torch.compile cannot trace 04's checkpointing: Dynamo takes a checkpoint's context_fn only as a
    # module-level function or a functools.partial, and 04's is a closure (one per segment), so it
    # raises "NotImplementedError: checkpoint not implemented for <NestedUserFunctionVariable>
    # context_fn" (torch 2.14). The compile rung builds on +AMP, beside +memory.
    Notebook("05", "05_compile.ipynb", "torch.compile",
             ("compile_inference", "break_even_steps", "COMPILE_TRAINING", "attention"),
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


# --- A sitting per notebook: the student's time and the compute time per device class ----------

# Minutes of the student's own work, the graded part. An
# estimate from each master: reading its prose at 150 words a minute, a minute per line of solution
# code (writing and debugging it), a minute per 15 lines of given code, running it three times on
# class cpu-bf16, 20 minutes for 06's written analysis; rounded up to 15 minutes. At most 90 each.
# 02, 04 and 05 gained a section of ungraded measurements to read (issue 64's topics, about 500 words
# and two cells each): 15 minutes more each; 01's went to its optional part. 04's graded
# training_bytes (3 lines of solution, about 150 words) fits in that rounding: 04 stays at 75; so
# does 05's graded attention (1 line, about 100 words): 05 stays at 60.
STUDENT_MINUTES: dict[str, int] = {"01": 90, "02": 75, "03": 45, "04": 75, "05": 60, "06": 60, "07": 60,
                                   "08": 15}
MAX_STUDENT_MINUTES = 90  # one sitting
OPTIONAL_MINUTES: dict[str, int] = {"01": 45}  # an optional, ungraded part after the checks, beyond the sitting


@dataclass(frozen=True)
class ComputeTimes:
    """How long the reference notebooks compute on one device class, and how we know."""

    device_class: str  # a class of labsupport.hardware.CLASSES, or a GPU family's profile
    how: str  # the machine, the command and the software; and how the estimates were made
    seconds: dict[str, tuple[int, int]]  # notebook -> (low, high) seconds
    measured: tuple[str, ...] = ()  # the notebooks whose seconds were measured (low == high); the rest estimated


# The measured times predate issue 64's topic cells (01's optional part, 02, 04 and 05's new sections):
# at the tiny profile on class cpu-bf16, beside other jobs on its 2 cores, 0-33 s each (05's export
# the longest), 21 s for 01's, 4 s for 04's, 37 s for 05's: not yet measured at the real profiles.
_CPU_BF16 = {"01": 57, "02": 71, "03": 79, "04": 86, "05": 93, "06": 73, "07": 126, "08": 59}
_CPU = {"01": 34, "02": 45, "03": 123, "04": 66, "05": 95, "06": 70, "07": 185, "08": 38}
_T4 = {"01": (180, 300), "02": (240, 360), "03": (240, 360), "04": (180, 300), "05": (360, 600),
       "06": (60, 180), "07": (360, 600), "08": (120, 180)}
# Seconds of each notebook's graded checks on one H200 (accept --parts checks, 2026-11-26; README).
_H200_CHECKS = {"03": 13, "04": 13, "05": 23, "06": 86, "07": 92, "08": 0}
ALL = tuple(nb.number for nb in NOTEBOOKS)

COMPUTE: tuple[ComputeTimes, ...] = (
    ComputeTimes("cpu-bf16", "make run on main f3e2e58 (2026-11-29, with the topic cells and 06's paired ladder): "
                 "2 cores of an AMD EPYC with AVX-512 BF16 and no AMX, 112 px, batch 32, torch 2.14", {n: (s, s) for n, s in _CPU_BF16.items()}, ALL),
    ComputeTimes("cpu", "ONEDNN_MAX_CPU_ISA=AVX2 make run on main eaf4933 (2026-11-29, with the topic cells): 2 cores "
                 "of an AMD EPYC (Zen 4) with oneDNN held to AVX2, as a CPU without bf16 units runs it, 64 px, "
                 "batch 32, torch 2.14", {n: (s, s) for n, s in _CPU.items()}, ALL),
    ComputeTimes("cuda-tensorcore-xl", "an H200, torch 2.11 (2026-11-26): 01 measured under make run, 02 its cells "
                 "169 s and its checks 176 s measured apart; 03-08 estimated as one to two times their graded "
                 "checks' seconds there (accept --parts checks), plus a minute",
                 {"01": (293, 293), "02": (345, 345),
                  **{n: (s + 60, 2 * s + 120) for n, s in _H200_CHECKS.items()}}, ("01", "02")),
    ComputeTimes("cuda-tensorcore", "estimated, not measured (a Colab T4): the naive loader's PIL decoding on "
                 "Colab's 2 vCPUs (300-400 images/s a core) sets 01 and 02; the others from the T4-sized step "
                 "(about 15 ms in fp16) and compiles of minutes", _T4),
    ComputeTimes("cuda", "estimated, not measured (an older GPU, a P100 say): the T4's estimate times 1-1.5 "
                 "(fp16 without tensor cores, nothing compiled)",
                 {n: (a, round(1.5 * b)) for n, (a, b) in _T4.items()}),
    ComputeTimes("cpu-amx", "estimated, not measured (2 cores of an Intel Xeon with AMX): class cpu-bf16's measured "
                 "times, times 0.7-1 (AMX's bf16 convolutions are faster; the fp32 and loader work is not)",
                 {n: (round(0.7 * s), s) for n, s in _CPU_BF16.items()}),
    ComputeTimes("mps", "estimated, not measured (Apple silicon): class cpu-bf16's measured times, times 1-3 "
                 "(the same image size, twice the batch)", {n: (s, 3 * s) for n, s in _CPU_BF16.items()}),
)


def _span(low: int, high: int) -> str:
    if high < 120:
        return f"{low} s" if low == high else f"{low}-{high} s"
    return f"{low / 60:.0f} min" if low == high else f"{low / 60:.0f}-{high / 60:.0f} min"


def sitting(number: str, lab=None) -> "pd.DataFrame":
    """Notebook ``number``'s time: the student's work, and its compute time on each device class,
    measured or estimated, with ``lab``'s class marked (the table every notebook shows under its
    setup cell)."""
    import pandas as pd

    nb = get(number)
    extra = (f" (and about {OPTIONAL_MINUTES[number]} more for the optional part)"
             if number in OPTIONAL_MINUTES else "")
    print(f"{nb.number} · {nb.title}: about {STUDENT_MINUTES[number]} minutes of your own work{extra}, an estimate; "
          "the notebook computes for the time below on your machine's class:")
    here = lab.machine.profile if lab is not None else None  # its class, or its GPU family's profile
    rows = {times.device_class: {"compute": _span(*times.seconds[number]),
                                 "": "measured" if number in times.measured else "estimated",
                                 "this machine": "<-" if times.device_class == here else "",
                                 "how": times.how} for times in COMPUTE}
    return pd.DataFrame(rows).T.rename_axis("device class (profile)")
