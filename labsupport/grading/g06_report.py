"""Graded checks of 06_report: the student's ladder, their composed pipeline, their report.

- ``06-stages``: every rung was recorded by 01-05 on this machine.
- ``06-ladder-table``: ``assemble_ladder`` builds the ladder right from crafted results and from
  this machine's (checked row by row against what each column means).
- ``06-end-to-end``: the student's composed pipeline (02's loader, 03's precision and step, 05's
  compile choice) against the naive baseline, paired, now.
- ``06-html``: the report was exported now, with the machine, the ladder table and the plots.

Each check is written once, against ``sides``: :class:`Here` runs the student's code in this
process (the notebook's self-check); the grader's judge passes its :class:`Remote`, which
holds the student's ``assemble_ladder`` and composed pipeline in a worker of their own and the
naive pipeline in another, and decides on what they send back.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pandas as pd

from .. import measure, notebooks, pipeline, report, results, train
from . import StudentCodeError, judge, partners, register, rungs, speed, student, written_now
from .g03_amp import timed_calls, trains
from .g06_worker import HeldPipeline, Here, composed_step, fp32_start, table_from, table_message  # noqa: F401
from .judge_setup import Judged, MODEL_BYTES, RemoteSides


@register("06-stages")
def stages(namespace, lab, sides=None):
    """Every rung of the ladder was recorded, on this machine."""
    lad = report.ladder(machine=lab.machine.as_dict())
    present = len(lad.rows)
    return [judge("06-stages", present, lab,
                  note="; ".join(lad.missing) or f"all {present} stages recorded on this machine")]


def crafted_results() -> pd.DataFrame:
    """Results rows with known answers, some cells missing."""
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
def ladder_table(namespace, lab, sides=None):
    """assemble_ladder builds the ladder from any results: a crafted set, and this machine's."""
    student(namespace, "assemble_ladder", "06")
    assemble = (sides or Here(namespace, lab)).assemble_ladder
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
    return [judge("06-ladder-table", float(not wrong), lab, correct=not wrong,
                  why_incorrect="; ".join(wrong))]


@register("06-end-to-end")
def end_to_end(namespace, lab, sides=None):
    """The student's composed pipeline, loader included, re-measured against the naive baseline now.

    Its partners: the step sees the baseline's batch size and trains; every timed call of either
    pipeline is one step on its next batch from the same (fresh) weights, and three of the
    student's, chosen after the timing, are trained again here by the lab's fp32 step on the
    batches they kept and must have trained alike; and every rung was measured on this machine with
    ``assemble_ladder`` defined (an untouched notebook earns nothing here).
    """
    student(namespace, "assemble_ladder", "06")
    sides = sides or Here(namespace, lab)
    sides.assemble_ladder(crafted_results())  # must run: no free points
    lad = report.ladder(machine=lab.machine.as_dict())
    profile = lab.profile
    naive, fast = sides.pipeline("baseline"), sides.pipeline("candidate")
    # First, so that a float16 GradScaler has found its scale before the step must train (at 32 px
    # its initial 65536 overflowed both of the partner's two steps, and an honest step failed).
    sides.focus("candidate")
    fast.settle()
    seen = len(fast.fetch())
    ok, why = trains(fast, steps=2)
    if ok and seen != profile.batch_size:
        ok, why = False, f"your pipeline's step sees {seen} samples, the baseline's {profile.batch_size}"
    sides.focus(None)
    draws: list[int] = []
    (naive_call, _), (fast_call, fast_calls) = timed_calls(naive, draws), timed_calls(fast, draws)

    def naive_habit():  # the naive habit: the loss's .item() every step, which waits for the device
        return float(naive_call())

    with sides.checking():
        cmp = measure.compare(naive_habit, fast_call, lab.device, rounds=profile.rounds,
                              steps_per_round=profile.steps_per_round, warmup=max(1, profile.warmup_steps),
                              focus=sides.focus, verify=getattr(sides, "verify", None))
    sides.focus(None)
    if ok:
        ok, why = kept_batches_train_as_fp32(fast, fast_calls, draws, lab)
    # Last, and said in the details: calibrate measures this check with no ladder of 01-05 to
    # check against, and excuses this partner alone (autograder/calibrate.py's _usable).
    ladder_only = ok and bool(lad.missing)
    if ladder_only:
        ok, why = False, "the ladder is incomplete: " + "; ".join(lad.missing)
    result = speed(lab, "06-end-to-end", cmp.speedup.median, correct=ok, why_incorrect=why)
    wait_ms = fast.wait_ms()  # its own data wait: a loader's pause shows here, whatever else runs
    return [dataclasses.replace(result, note=(result.note + "; " if result.note else "") +
                                f"{cmp} (your loader and step: {fast.describe()}; your loader kept the step "
                                f"waiting {wait_ms:.1f} ms per batch)",
                                details={**cmp.summary(), "data_wait_ms": wait_ms,
                                         "only_the_ladder_incomplete": ladder_only,
                                         "baseline_step_ms": cmp.summary()["baseline_ms"]})]


def kept_batches_train_as_fp32(held, calls: list[partners.Call], draws: list[int], lab,
                               chosen: int = 3) -> tuple[bool, str]:
    """``chosen`` of ``held``'s timed calls, picked after the timing, trained again here by the lab's
    fp32 step from the same start on the batch each call kept: each must have trained as that step
    does (:func:`partners.updates_alike`, at the positions the call's update was read at, ``draws``).

    The calls of one pipeline each saw a batch of their own, so the partner is computed now, on
    what the call says it trained on; that batch must be the profile's shape. A call the pipeline
    says a float16 GradScaler skipped must have changed no weight, and is not chosen; more than
    half skipped fails.
    """
    skipped = held.skipped()
    if not isinstance(skipped, list) or len(skipped) != len(calls):
        return False, f"your pipeline accounted for {len(skipped) if isinstance(skipped, list) else 'none'} of its {len(calls)} timed calls"
    for i, (skip, call) in enumerate(zip(skipped, calls)):
        if skip and bool(call.update.count_nonzero()):
            return False, f"timed call {i + 1} counts as skipped by the GradScaler, yet it changed the weights"
    usable = [i for i, skip in enumerate(skipped) if not skip]
    if len(usable) < len(calls) / 2:
        return False, (f"the GradScaler skipped {len(calls) - len(usable)} of your {len(calls)} "
                       "timed steps (their gradients overflowed)")
    picked = sorted(random.SystemRandom().sample(usable, min(chosen, len(usable))))
    profile, size = lab.profile, lab.profile.image_size
    fp32 = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    start = partners.snapshot(fp32.model)
    wants = []
    for i in picked:
        images, labels = held.kept(index=i)
        if tuple(images.shape) != (profile.batch_size, 3, size, size) or tuple(labels.shape) != (profile.batch_size,):
            return False, (f"timed call {i + 1} kept a batch of {tuple(images.shape)} images and "
                           f"{tuple(labels.shape)} labels, not the profile's ({profile.batch_size}, 3, {size}, {size})")
        again = partners.FromOneStart(fp32, start, fp32.to_device(images, labels.long()))
        again.run()
        wants.append(again.update_at(draws[i]))
    return partners.updates_alike([calls[i] for i in picked], wants, [n for n, _ in fp32.model.named_parameters()],
                                  of=f"timed call (sampled after the timing: {', '.join(str(i + 1) for i in picked)} of "
                                     f"{len(calls)}),", baseline="the lab's fp32 step")


@register("06-html")
def html_report(namespace, lab, sides=None):
    """The notebook exported the report: one HTML file, written now, with the ladder table and the plots."""
    student(namespace, "assemble_ladder", "06")
    (sides or Here(namespace, lab)).assemble_ladder(crafted_results())  # the student's table is in it
    path = written_now(report.default_path(), "the export cell of 06 (ls.report.export_html)")
    text = path.read_text(encoding="utf-8", errors="replace")
    found = {"ladder table": 'class="dataframe ladder"' in text,
             "embedded plots": text.count('src="data:image/png;base64,') >= 1,
             "machine": 'class="dataframe machine"' in text}
    missing = [k for k, v in found.items() if not v]
    return [judge("06-html", float(not missing), lab, correct=not missing,
                  why_incorrect=f"{path.name} lacks: {', '.join(missing)}")]



class Remote(RemoteSides):
    """06's judge side: each pipeline held in its side's worker (:class:`~.g06_worker.Side`); the
    student's ``assemble_ladder`` run in theirs, its table rebuilt here from plain values."""

    def pipeline(self, side: str):
        """The naive pipeline (baseline) or the student's composed one (candidate), held in ``side``'s worker."""
        return self.sides.held(side, "pipeline", asked=HeldPipeline.ASKED, slow=True)

    def assemble_ladder(self, frame):
        """The table the student's ``assemble_ladder`` returned on ``frame`` (a StudentCodeError
        where it is not a DataFrame)."""
        reply = self.sides.ask("candidate", "assemble", frame=table_message(frame, rows=1000)).get("value")
        if not isinstance(reply, dict) or "table" not in reply:
            kind = reply.get("type") if isinstance(reply, dict) else type(reply).__name__
            raise StudentCodeError(f"assemble_ladder returned a {str(kind)[:80]}, not a pandas DataFrame")
        try:
            return table_from(reply["table"])
        except ValueError:
            raise StudentCodeError("assemble_ladder's table could not be read") from None


# How the judge sets up 06's checks: the naive pipeline in a worker of its own, the ladder and the
# report handed over, the composed pipeline built from the rungs; a model's state crosses; on a GPU
# a verdict process decides (:func:`.judge_setup.judges` says why).
JUDGED = Judged(baseline=True, reads_ladder=True, composes=True, buffer_floor=MODEL_BYTES + 2**20,
                not_on=("cuda", "mps"), compared=("06-end-to-end",), remote=Remote)
