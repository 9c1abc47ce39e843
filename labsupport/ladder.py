"""The ladder's data: each rung timed and recorded, and the ladder read back from the results store.

One module times a rung, for every caller: a notebook (:func:`measure_rung`, in the step's own
process), the grader (:mod:`labsupport.grading.rungs`: :func:`measure_rung` on the baseline or the
student's carried code, :func:`measure_timed` on a step its judge drives from outside) and 06,
which measures again here a rung recorded elsewhere. :func:`ladder` reads the results store back,
keeps the rungs measured on this machine (a stage that was not recorded, or was recorded
elsewhere, is listed with the notebook to run, never raised as a stack trace) and builds the
ladder table with an ``assemble`` function: the student's own ``assemble_ladder`` from 06 (the
instructor's commands pass the reference's). Columns: samples/s, speedup (cumulative), speedup
(this rung: against the rung it builds on), peak MiB, accuracy %. :func:`rung_details` and
:func:`phases` are the report's tables of each rung. Re-exported by :mod:`labsupport.report`
(``ls.report.ladder``, ``ls.report.measure_rung``, ``ls.report.RUNGS``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import hardware, measure, memory, notebooks, pipeline, results, train
from .profiling import PHASES

# The ladder's rungs, in order: (stage recorded in the results store, rung label), from the registry.
RUNGS = tuple((nb.stage, nb.rung) for nb in notebooks.rungs())
COLUMNS = ("samples/s", "speedup (cumulative)", "speedup (this rung)", "peak MiB", "accuracy %")

# Why some cells of the ladder are empty, and why +compile sits beside +memory (printed under the
# table by `make run` and in the report).
LADDER_NOTE = ("Each rung adds one change to the rung it builds on; +compile builds on +AMP, since "
               "torch.compile cannot trace 04's checkpointing. Peak memory is counted op by op on every "
               "rung except the compiled one, whose fused kernels are not ops. Accuracy comes "
               "from 03's training run, fp32 against 16-bit; 04 and 05 check correctness by "
               "comparing gradients and outputs instead. Each rung was timed in its own notebook, at "
               "another time: the ratios between rungs are not paired measurements (each notebook's graded "
               "speedup is paired, in one process).")


@dataclass
class Ladder:
    """The ladder table and what is missing from it."""

    table: pd.DataFrame  # one row per recorded rung, indexed by rung label (what `assemble` built)
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)  # the records behind it: stage, batch, metrics
    missing: list[str] = field(default_factory=list)  # "stage: why, and which notebook to run"
    machine: dict = field(default_factory=dict)  # the machine the rungs were measured on
    # Per recorded rung: how its step was set up, {stage: {"amp_dtype", "image_size"}} (for roofline)
    setups: dict = field(default_factory=dict)
    # Rungs recorded on another machine, left out of the table: {stage: "device name (class)"}.
    # measure_here() measures them again on this one, from the student's carried code.
    elsewhere: dict = field(default_factory=dict)
    directory: Path | None = None  # the results store it was read from (the roofline's peaks are kept there)


def machine_label(machine: dict) -> str:
    """A recorded machine as the ladder names it: "device name (class)"."""
    return f"{machine.get('device_name')} ({machine.get('device_class')})"


def ladder(directory: Path | str | None = None, machine: dict | None = None,
           assemble: Callable[[pd.DataFrame], pd.DataFrame] | None = None) -> Ladder:
    """The ladder from the results store.

    ``machine`` (default: the baseline's) is the machine every rung must come from; a rung
    recorded elsewhere is left out and listed in ``missing``. ``assemble(rows)`` turns the
    records (columns ``stage``, ``batch`` and the metrics) into the table; without it the table
    is empty and only ``rows`` and ``missing`` are filled.
    """
    records, missing = {}, []
    for stage, label in RUNGS:
        try:
            records[stage] = results.load(stage, Path(directory) if directory else None)
        except results.ResultsError as err:
            missing.append(f"{stage} ({label}): {err}")
    if machine is None and records:
        machine = next(iter(records.values()))["machine"]
    rows, setups, elsewhere = [], {}, {}
    for stage, label in RUNGS:
        rec = records.get(stage)
        if rec is None:
            continue
        if machine and not hardware.same_machine(rec["machine"], machine):
            elsewhere[stage] = machine_label(rec["machine"])
            missing.append(f"{stage} ({label}): recorded on {elsewhere[stage]}, not on this machine; run "
                           f"{results.notebook_for(stage)} here, or ls.paired.measure_here(lab, [{stage!r}]) "
                           "to measure it again here from your carried code.")
            continue
        nb = notebooks.by_stage(stage)
        rows.append({"stage": stage, "batch": (rec.get("profile") or {}).get("batch_size"),
                     "change": nb.change or "", "builds_on": nb.builds_on, **rec["metrics"]})
        setups[stage] = _setup(rec)
    frame = pd.DataFrame(rows, columns=None if rows else ["stage", "batch", "change", "samples_per_s"])
    table = assemble(frame.copy()) if assemble else pd.DataFrame(columns=list(COLUMNS))
    return Ladder(table, frame, missing, machine or {}, setups, elsewhere, Path(directory) if directory else None)


# What a rung's record may say about its step, for the roofline (records come from results
# stores that a student's code wrote; an instructor's report reads them): anything else is dropped.
SETUP_DTYPES = ("float32", "bfloat16", "float16")
SETUP_SIZES = range(16, 1025)


def _setup(rec: dict) -> dict:
    """The step's dtype and image size from rung record ``rec``, each only if it is one the lab runs
    (a dtype name of :data:`SETUP_DTYPES`, an integer size in :data:`SETUP_SIZES`), else None: the
    roofline then leaves the rung out rather than count FLOPs at a size or dtype it was handed."""
    config, profile = rec.get("config"), rec.get("profile")
    dtype = config.get("amp_dtype") if isinstance(config, dict) else None
    size = profile.get("image_size") if isinstance(profile, dict) else None
    if dtype is not None and not (isinstance(dtype, str) and dtype in SETUP_DTYPES):
        return {"amp_dtype": None, "image_size": None}
    return {"amp_dtype": dtype, "image_size": size if type(size) is int and size in SETUP_SIZES else None}


def measure_rung(stage: str, step, loader, lab, *, profile=None, progress: bool = True, **extra) -> dict:
    """Measure one rung of the ladder end to end, now, and record it.

    The lab's one timing path for every rung, so rungs compare: ``loader`` feeds ``step`` for the
    profile's warm-up and measured steps (throughput at the median step, with its IQR), then a
    phase breakdown (data wait, host to device, forward, backward, optimizer), then the peak
    memory of one step where it can be counted (not a compiled step off CUDA: the CPU count runs
    it eagerly). The baseline logs ``loss.item()`` every step, as the naive script does; the
    other rungs copy asynchronously and do not. Recorded with the step's config, the profile,
    the machine, the rung's one change and the rung it builds on (the registry). ``extra``
    metrics are recorded too. Returns the metrics.
    """
    profile = profile or lab.profile
    nb = notebooks.by_stage(stage)
    naive = nb.builds_on is None
    batches = pipeline.forever(loader)
    timing = measure.time_steps(train.pipeline_step(batches, step, non_blocking=not naive, item_every_step=naive),
                                lab.device, warmup=profile.warmup_steps, steps=profile.measure_steps,
                                samples_per_step=profile.batch_size, progress=progress)
    phases = train.phase_breakdown(batches, step, steps=max(3, profile.measure_steps // 2), warmup=1,
                                   non_blocking=not naive)
    metrics = {**timing.summary(), "phases_ms": {p: float(pd.Series(v).median()) for p, v in phases.items()}}
    if not step.config.compiled:  # counted op by op (memory.TensorBytes): a compiled step's kernels are not ops
        x, y = step.to_device(*next(batches))
        metrics["peak_bytes"] = memory.peak_step_bytes(lambda: step(x, y), lab.device).peak_bytes
    metrics.update(extra, change=nb.change, builds_on=nb.builds_on)
    results.record(stage, metrics, config=step.config, machine=lab.machine, profile=profile)
    return metrics


def measure_timed(stage: str, step: Callable[[], object], config, lab, *, extra: dict | None = None,
                  wait: Callable[[], object] | None = None, peak: Callable[[], float] | None = None,
                  verify: Callable[[str], Callable[[], str]] | None = None) -> dict:
    """Record rung ``stage`` timed from outside (the grader's judge): ``wait()`` fetches the next
    batch from the student's loader onto the device elsewhere, ``step()`` trains on it; each returns
    when it is done. Throughput as :func:`measure_rung` times it, and of the phases only the data
    wait (the fetch's time), which is all a clock outside can split off. Peak memory only the
    process running the step can count: where ``peak()`` asks it for one step's (04's rung, whose
    point is its memory), it is recorded as that process's count. ``lab``'s profile is the rung's
    (04's: twice the batch); ``config`` the step's; ``extra``: recorded beside it (the notebook's
    checks' figures). ``verify``: the timing and the waits are each one block, kept only where it
    says the baseline's worker, stopped, did not run (:func:`labsupport.measure.verified`)."""
    import statistics
    import time

    nb = notebooks.by_stage(stage)
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
    if peak is not None:
        metrics.update(peak_bytes=float(peak()), peak_counted_by="the worker running the student's step")
    metrics.update(**(extra or {}), timed_by="the grader's judge, from outside", change=nb.change, builds_on=nb.builds_on)
    results.record(stage, metrics, config=config, machine=lab.machine, profile=profile)
    return metrics


def rung_details(lad: Ladder) -> pd.DataFrame:
    """Per recorded rung: its one change, the rung it builds on, throughput with its spread (from
    the step times' IQR), step time, peak memory and accuracy."""
    labels = dict(RUNGS)
    rows = []
    for _, rec in lad.rows.iterrows():
        get = lambda key: rec[key] if key in rec and pd.notna(rec[key]) else float("nan")  # noqa: E731
        median, iqr, batch = get("median_ms"), get("iqr_ms"), get("batch")
        rows.append({"rung": labels.get(rec["stage"], rec["stage"]), "change": get("change"),
                     "builds on": labels.get(get("builds_on"), "") if isinstance(get("builds_on"), str) else "",
                     "batch": batch, "samples/s": get("samples_per_s"),
                     "samples/s IQR": (f"{batch / (median + iqr / 2) * 1000:,.1f}-{batch / max(median - iqr / 2, 1e-9) * 1000:,.1f}"
                                       if pd.notna(iqr) and pd.notna(batch) and pd.notna(median) else ""),
                     "step ms (median)": median, "peak MiB": get("peak_bytes") / 2**20,
                     "accuracy %": 100 * get("accuracy"),
                     "measured": (f"again in 06, here (first on {get('first_measured_on')})"
                                  if isinstance(get("first_measured_on"), str) else "in its notebook")})
    return pd.DataFrame(rows).set_index("rung") if rows else pd.DataFrame()


def phases(lad: Ladder) -> pd.DataFrame:
    """Milliseconds per phase of a rung's step, adding up to the step time the ladder gives it.

    The breakdown (:func:`labsupport.train.phase_breakdown`) runs on the rung's own step and loader
    right after its timed steps, synchronising at every phase boundary: its *shares* are what it
    measures (:class:`labsupport.measure.PhaseClock`), so each share is drawn on the rung's timed
    median step, and a breakdown whose stamped steps took far longer or shorter than the timed ones
    is named in :func:`phase_mismatches`. A rung without a median step, or timed from outside by the
    grader's judge (its data wait only), keeps its stamped times.
    """
    labels, rows = dict(RUNGS), {}
    for _, rec in lad.rows.iterrows():
        stamped = rec.get("phases_ms")
        if not isinstance(stamped, dict):
            continue
        stamped = {p: float(v) for p, v in stamped.items() if p in PHASES and isinstance(v, (int, float))}
        total, median = sum(stamped.values()), rec.get("median_ms")
        whole = set(stamped) == set(PHASES) and total > 0 and isinstance(median, (int, float)) and median > 0
        scale = median / total if whole else 1.0
        rows[labels.get(rec["stage"], rec["stage"])] = {p: v * scale for p, v in stamped.items()}
    return pd.DataFrame(rows).T.reindex(columns=list(PHASES)) if rows else pd.DataFrame()


# A breakdown whose stamped steps summed to more than this factor off the timed median step was
# measured under other conditions than the step it describes (the issue-63 baseline: 1,580 ms
# stamped against a 368 ms median): the report says so beside the chart.
PHASE_MISMATCH = 1.25


def phase_mismatches(lad: Ladder) -> list[str]:
    """The rungs whose breakdown's stamped steps took far longer or shorter than their timed ones."""
    labels, out = dict(RUNGS), []
    for _, rec in lad.rows.iterrows():
        stamped, median = rec.get("phases_ms"), rec.get("median_ms")
        if not isinstance(stamped, dict) or set(stamped) != set(PHASES) or not isinstance(median, (int, float)) \
                or median <= 0:
            continue
        total = sum(v for v in stamped.values() if isinstance(v, (int, float)))
        if total > 0 and not 1 / PHASE_MISMATCH <= total / median <= PHASE_MISMATCH:
            out.append(f"{labels.get(rec['stage'], rec['stage'])}: its breakdown's steps took {total:,.0f} ms "
                       f"against a timed median of {median:,.0f} ms; the chart draws its shares on the timed step")
    return out
