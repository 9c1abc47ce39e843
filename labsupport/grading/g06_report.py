"""Graded checks of 06_report: the student's ladder, their composed pipeline, their report.

- ``06-stages``: every rung was recorded by 01-05 on this machine.
- ``06-ladder-table``: ``assemble_ladder`` builds the ladder right from crafted results and from
  this machine's (checked row by row against what each column means).
- ``06-end-to-end``: the student's composed pipeline (02's loader, 03's precision and step, 05's
  compile choice) against the naive baseline, paired, now.
- ``06-html``: the report was exported now, with the machine, the ladder table and the plots.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import pandas as pd

from .. import measure, notebooks, pipeline, report, results, train
from . import StudentCodeError, carried, judge, partners, register, speed, student, written_now
from .g03_amp import amp_step, precision


@register("06-stages")
def stages(namespace, lab):
    """Every rung of the ladder was recorded, on this machine."""
    lad = report.ladder(machine=lab.machine.as_dict())
    present = len(lad.rows)
    return [judge("06-stages", present, lab.machine.as_dict(),
                  note="; ".join(lad.missing) or f"all {present} stages recorded on this machine")]


def crafted_results() -> pd.DataFrame:
    """Results rows with known answers, some cells missing (Used by: the 06 checks and their tests)."""
    rows = [("01-baseline", 40.0, 300e6, None), ("02-data", 50.0, 300e6, None), ("03-amp", 80.0, 200e6, 0.93),
            ("04-memory", 84.0, 250e6, None), ("05-compile", 76.0, None, None)]
    return pd.DataFrame([{"stage": s, "samples_per_s": t, "peak_bytes": p, "accuracy": a} for s, t, p, a in rows])


def _close(got, want) -> bool:
    got, want = float(got), float(want)
    return (math.isnan(got) and math.isnan(want)) or math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)


def ladder_problems(frame: pd.DataFrame, table) -> list[str]:
    """What is wrong with ``table`` as the ladder of results ``frame``, one sentence each ([] if right).

    Rows: one per rung recorded in ``frame``, in ladder order, labelled as in ``report.RUNGS``.
    Each column is checked against its definition: samples/s as recorded, speedup against the
    baseline and against the rung it builds on (the registry's ``builds_on``), peak bytes in MiB,
    accuracy in percent (empty where not recorded).
    """
    if not isinstance(table, pd.DataFrame):
        return [f"assemble_ladder returned a {type(table).__name__}, not a pandas DataFrame"]
    missing = [c for c in report.COLUMNS if c not in table.columns]
    if missing:
        return [f"columns {missing} are missing (expected {list(report.COLUMNS)})"]
    by_stage = frame.set_index("stage") if "stage" in frame else pd.DataFrame()
    recorded = [(stage, label) for stage, label in report.RUNGS
                if stage in by_stage.index and pd.notna(by_stage.loc[stage].get("samples_per_s"))]
    if [str(i) for i in table.index] != [label for _, label in recorded]:
        return [f"rows {list(table.index)}, expected {[label for _, label in recorded]} (one per recorded "
                "rung, in ladder order, labelled as in ls.report.RUNGS)"]
    nan = float("nan")
    base = by_stage.loc["01-baseline", "samples_per_s"] if "01-baseline" in by_stage.index else nan
    rates = {stage: by_stage.loc[stage, "samples_per_s"] for stage, _ in recorded}
    problems = []
    for (stage, label), (_, got) in zip(recorded, table.iterrows()):
        rec = by_stage.loc[stage]
        value = lambda key: rec[key] if key in rec and pd.notna(rec[key]) else nan  # noqa: E731
        samples, before = value("samples_per_s"), notebooks.by_stage(stage).builds_on
        want = {"samples/s": samples, "speedup (cumulative)": samples / base,
                "speedup (this rung)": samples / rates.get(before, nan) if before else nan,
                "peak MiB": value("peak_bytes") / 2**20, "accuracy %": 100 * value("accuracy")}
        for column, expected in want.items():
            try:
                ok = _close(got[column], expected)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                problems.append(f"{label}, {column}: {got[column]!r}, expected {expected:.4g}")
    return problems


@register("06-ladder-table")
def ladder_table(namespace, lab):
    """assemble_ladder builds the ladder from any results: a crafted set, and this machine's."""
    assemble = student(namespace, "assemble_ladder", "06")
    wrong = []
    for name, frame in (("the crafted results", crafted_results()), ("this machine's results", None)):
        if frame is None:
            try:
                frame = results.load_all()
            except results.ResultsError:
                continue
            if frame.empty:  # nothing recorded yet: 06-stages says which notebooks to run
                continue
        problems = ladder_problems(frame, assemble(frame.copy()))
        if problems:
            wrong.append(f"on {name}: " + "; ".join(problems[:3]))
    return [judge("06-ladder-table", float(not wrong), lab.machine.as_dict(), correct=not wrong,
                  why_incorrect="; ".join(wrong))]


def composed_step(lab, *, seed: int | None = None) -> tuple[train.TrainStep, object, str]:
    """The student's optimised training, composed from their own code: ``(step, loader, note)``.

    02's loader, 03's precision choice and mixed-precision step, and 05's ``COMPILE_TRAINING``
    choice (all carried forward), at the baseline's batch: checkpointing buys memory, not speed,
    so it is not in it. Without a compile choice from 05 the step is not compiled, and the note
    says so. Used by: 06's end-to-end check.
    """
    loader_code, amp_code = carried("02", lab), carried("03", lab)
    dtype, channels_last = precision(amp_code.choose_precision, lab.machine)
    try:
        compiled, note = bool(carried("05", lab).COMPILE_TRAINING), "your 05 choice"
    except (StudentCodeError, AttributeError):
        compiled, note = False, "not compiled: COMPILE_TRAINING was not kept from 05 (run its checks)"
    step = amp_step(amp_code.amp_train_step, dtype, channels_last, lab.device,
                    seed=lab.seed if seed is None else seed, compiled=compiled)
    return step, loader_code.make_fast_loader(lab), note


@register("06-end-to-end")
def end_to_end(namespace, lab):
    """The student's composed pipeline, loader included, re-measured against the naive baseline now.

    Its partners: the step sees the baseline's batch size and trains; three of the timed calls,
    chosen after the timing, trained as the lab's fp32 step does from the same weights on the
    batches they were given (every timed call is one step from the same weights); and every rung
    was measured on this machine with ``assemble_ladder`` defined (an untouched notebook earns
    nothing here).
    """
    student(namespace, "assemble_ladder", "06")(crafted_results())  # must run: no free points
    lad = report.ladder(machine=lab.machine.as_dict())
    profile = lab.profile
    fast_step, loader, compile_note = composed_step(lab)
    naive_step = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    naive_batches = pipeline.forever(pipeline.naive_loader(profile, seed=lab.seed))
    batches = pipeline.forever(loader, timed=True)
    # What is timed is checked: every timed call of either pipeline is one step on its next batch
    # from the same (fresh) weights; after the timing, three of your timed calls, chosen then, are
    # trained again by the lab's fp32 step on the batches they kept, and must have trained alike.
    start = partners.snapshot(naive_step.model)
    naive_timed = partners.FromOneStart(naive_step, start, lambda: naive_step.to_device(*next(naive_batches)),
                                        seed=lab.seed)
    fast = partners.FromOneStart(fast_step, start, lambda: fast_step.to_device(*next(batches), True),
                                 seed=lab.seed, keep=True)
    # First, so that a float16 GradScaler has found its scale before the step must train (at 32 px
    # its initial 65536 overflowed both of the partner's two steps, and an honest step failed).
    fast.settle()
    x, y = fast_step.to_device(*next(batches))
    ok, why = partners.step_trains(fast_step, x, y, steps=2)
    if ok and x.shape[0] != profile.batch_size:
        ok, why = False, f"your pipeline's step sees {x.shape[0]} samples, the baseline's {profile.batch_size}"

    def naive():  # the naive habit: the loss's .item() every step, which waits for the device
        return naive_timed().item()

    cmp = measure.compare(naive, fast, lab.device, rounds=profile.rounds,
                          steps_per_round=profile.steps_per_round, warmup=max(1, profile.warmup_steps))
    if ok:
        ok, why = partners.trained_as_fp32(fast, lab.device, lab.seed)
    # Last, and said in the details: calibrate measures this check with no ladder of 01-05 to
    # check against, and excuses this partner alone (autograder/calibrate.py's _usable).
    ladder_only = ok and bool(lad.missing)
    if ladder_only:
        ok, why = False, "the ladder is incomplete: " + "; ".join(lad.missing)
    result = speed(lab, "06-end-to-end", cmp.speedup.median, correct=ok, why_incorrect=why)
    config = fast_step.config
    what = (f"{config.amp_dtype or 'float32'}, channels_last={config.channels_last}, "
            f"compiled={config.compiled} ({compile_note})")
    # Its own data wait: a loader's pause shows here directly, whatever else the machine is doing
    wait_ms = statistics.median(batches.waits_ms)
    return [dataclasses.replace(result, note=(result.note + "; " if result.note else "") +
                                f"{cmp} (your loader and step: {what}; your loader kept the step "
                                f"waiting {wait_ms:.1f} ms per batch)",
                                details={**cmp.summary(), "data_wait_ms": wait_ms,
                                         "only_the_ladder_incomplete": ladder_only})]


@register("06-html")
def html_report(namespace, lab):
    """The notebook exported the report: one HTML file, written now, with the ladder table and the plots."""
    student(namespace, "assemble_ladder", "06")(crafted_results())  # the student's table is in it
    path = written_now(report.default_path(), "the export cell of 06 (ls.report.export_html)")
    text = path.read_text(encoding="utf-8", errors="replace")
    found = {"ladder table": 'class="dataframe ladder"' in text,
             "embedded plots": text.count('src="data:image/png;base64,') >= 1,
             "machine": 'class="dataframe machine"' in text}
    missing = [k for k, v in found.items() if not v]
    return [judge("06-html", float(not missing), lab.machine.as_dict(), correct=not missing,
                  why_incorrect=f"{path} lacks: {', '.join(missing)}")]
