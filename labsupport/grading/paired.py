"""06's paired ladder: every rung it shows, timed in one process, interleaved in rounds.

Each notebook records its rung when it runs (:func:`labsupport.report.measure_rung`), minutes or
days apart, so the ratios between the recorded rungs are not paired: under load a rung was seen
reading 0.60x and the next 8.8x while the paired end-to-end check held 4.6x (issue 63). Here every
rung is built again from the code 02-05's checks carried forward, as the grader builds it
(:mod:`labsupport.grading.rungs`), warmed up, and timed in rounds: a round times
``steps_per_round`` steps of every rung, in ladder order on even rounds and reversed on odd ones
(as :func:`labsupport.measure.compare` alternates A B, B A), so that each ratio is read inside one
round, on one state of the machine. A rung reads its median images/s with the spread over the
rounds, and its speedups (against the baseline, and against the rung it builds on) as the median
of the per-round ratios with their quartiles. A rung slower than the one it builds on is explained
by a measured cause: the two steps profiled side by side (the operators whose time changed most,
per image) and, for a compiled rung, Dynamo's graphs, graph breaks and compile time.

Used by 06_report (``ls.paired.ladder(lab, lad).show()``), beside the per-notebook ladder. What it
shows is kept in the results store (:func:`labsupport.report.keep_paired`), and every report page
exported from that store shows it (06's, and 07's again with its inference table).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import torch

from .. import measure, notebooks, pipeline, train
from ..measure import Spread
from .rungs import measure_here  # noqa: F401 (06: a rung recorded on another machine, measured again here)


def load_average() -> tuple[float, float, float] | None:
    """The machine's load over 1, 5 and 15 minutes (``uptime``'s figures; None where unknown):
    timings read beside it, since another program on the same cores slows every rung."""
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except (AttributeError, OSError):  # Windows
        return None


def time_rounds(sides: dict[str, Callable[[], object]], device: torch.device | str, *, rounds: int,
                steps_per_round: int, progress: bool = False) -> tuple[dict[str, list[float]], list[tuple[str, ...]]]:
    """Seconds each side's ``steps_per_round`` steps took, per round, and each round's order.

    Round r times every side once, in the order given on even rounds and reversed on odd ones, each
    block through the lab's one steady-state timing path (:func:`labsupport.measure.time_steps`), so
    that a side's ratio to another is read within one round."""
    order = list(sides)
    seconds: dict[str, list[float]] = {side: [] for side in order}
    orders: list[tuple[str, ...]] = []
    loop = range(rounds)
    if progress:
        from tqdm.auto import tqdm
        loop = tqdm(loop, desc="paired ladder: rounds", leave=False)
    for r in loop:
        this = tuple(order if r % 2 == 0 else order[::-1])
        for side in this:
            timing = measure.time_steps(sides[side], device, warmup=0, steps=steps_per_round)
            seconds[side].append(sum(timing.times_ms) / 1000)
        orders.append(this)
    return seconds, orders


def _ratio_text(s: Spread) -> str:
    return f"{s.median:.2f}x ({s.q1:.2f}-{s.q3:.2f})"


@dataclass
class PairedLadder:
    """Every rung timed in one process, in interleaved rounds; what :func:`paired` returns."""

    stages: tuple[str, ...]  # the rungs timed, in ladder order
    labels: dict[str, str]  # stage -> rung label ("+AMP")
    builds_on: dict[str, str | None]  # stage -> the stage it adds its change to
    per_image_s: dict[str, tuple[float, ...]]  # stage -> seconds per image, one per round
    orders: tuple[tuple[str, ...], ...]  # the order the rungs were timed in, per round
    steps_per_round: int
    load: dict[str, tuple[float, float, float] | None] = field(default_factory=dict)  # "before"/"after"
    not_timed: dict[str, str] = field(default_factory=dict)  # stage -> why it is not in the ladder
    compiled: dict[str, dict] = field(default_factory=dict)  # stage -> compile time, graphs, breaks
    causes: dict[str, pd.DataFrame] = field(default_factory=dict)  # stage -> its profile beside its base's

    def rate(self, stage: str) -> Spread:
        """Images/s of ``stage``: median and spread over the rounds."""
        return Spread.of([1 / s for s in self.per_image_s[stage]])

    def speedup(self, stage: str, against: str) -> Spread:
        """``stage``'s speedup over ``against``: the median and spread of their per-round ratios."""
        return Spread.of([a / s for a, s in zip(self.per_image_s[against], self.per_image_s[stage])])

    def slower(self) -> list[str]:
        """Rungs whose median paired ratio to the rung they build on is below 1."""
        return [s for s in self.stages
                if self.builds_on[s] in self.per_image_s and self.speedup(s, self.builds_on[s]).median < 1]

    def table(self, recorded: pd.DataFrame | None = None) -> pd.DataFrame:
        """One row per rung: paired images/s and speedups (median, and quartiles over the rounds),
        beside what each notebook recorded on its own (``recorded``: the ladder's ``rows``)."""
        base = self.stages[0] if self.stages and self.builds_on[self.stages[0]] is None else None
        by_stage = recorded.set_index("stage") if recorded is not None and "stage" in recorded else None
        rows = {}
        for s in self.stages:
            r, before = self.rate(s), self.builds_on[s]
            row = {"samples/s, paired (IQR)": f"{r.median:.1f} ({r.q1:.1f}-{r.q3:.1f})",
                   "cumulative, paired": _ratio_text(self.speedup(s, base)) if base else "",
                   "this rung, paired": _ratio_text(self.speedup(s, before)) if before in self.per_image_s else ""}
            if by_stage is not None:
                own = by_stage["samples_per_s"].get(s) if "samples_per_s" in by_stage else None
                prior = by_stage["samples_per_s"].get(before) if before and "samples_per_s" in by_stage else None
                row["samples/s, its notebook"] = "" if own is None or pd.isna(own) else f"{own:.1f}"
                row["this rung, its notebook"] = ("" if own is None or prior is None or pd.isna(own) or pd.isna(prior)
                                                  else f"{own / prior:.2f}x")
            rows[self.labels[s]] = row
        return pd.DataFrame.from_dict(rows, orient="index")

    def summary(self) -> dict:
        """Plain numbers: per rung its median images/s, IQR and paired speedup on the rung it builds on."""
        out = {"rounds": len(self.orders), "steps_per_round": self.steps_per_round, "load": self.load}
        for s in self.stages:
            r, before = self.rate(s), self.builds_on[s]
            out[s] = {"samples_per_s": r.median, "q1": r.q1, "q3": r.q3, "rounds": r.n}
            if before in self.per_image_s:
                out[s]["this_rung"] = self.speedup(s, before).median
        return out

    def compile_line(self, stage: str) -> str:
        """What compiling ``stage``'s step took and made: its first step's time, Dynamo's graphs and breaks."""
        got = self.compiled[stage]
        return (f"{self.labels[stage]}: its compile took {got['compile_s']:.1f} s (its first step); Dynamo made "
                f"{got['graphs']} graph(s) with {got['graph_breaks']} graph break(s)"
                + (": " + "; ".join(got["reasons"]) if got["reasons"] else "") + ".")

    def explanation(self, stage: str) -> str:
        """Why ``stage`` is slower than the rung it builds on, from what was measured."""
        before = self.builds_on[stage]
        ratio = self.speedup(stage, before)
        lines = [f"{self.labels[stage]} ran at {_ratio_text(ratio)} of {self.labels[before]}'s images/s, paired"
                 + (" (its spread reaches 1: maybe not slower; measure again on a quieter machine)."
                    if ratio.q3 >= 1 else ", slower in most rounds.")]
        if stage in self.compiled:
            lines.append(self.compile_line(stage))
        frame = self.causes.get(stage)
        if frame is not None and len(frame):
            top = frame[frame["change, µs/image"] > 0].head(3)
            if len(top):
                lines.append("In the profile, per image, it spends more in " + ", ".join(
                    f"{op} (+{d:.0f} µs)" for op, d in top["change, µs/image"].items()) + ".")
        return " ".join(lines)

    def lines(self) -> list[str]:
        """What goes with the table: the rounds and the load they ran under, the rungs not timed,
        each compiled rung's compile, and the measured cause of every slower rung."""
        out = [f"{len(self.orders)} rounds of {self.steps_per_round} steps per rung, alternating order; "
               f"load average (1, 5, 15 min) {self.load.get('before')} before, {self.load.get('after')} after"]
        out += [f"not timed: {stage}: {why}" for stage, why in self.not_timed.items()]
        out += [self.compile_line(stage) for stage in self.compiled if stage not in self.slower()]
        return out + [self.explanation(stage) for stage in self.slower()]

    def show(self, recorded: pd.DataFrame | None = None) -> None:
        """Print the table, then :meth:`lines`, each slower rung's profile beside its base's."""
        with pd.option_context("display.width", 160, "display.max_colwidth", 40):
            print(self.table(recorded).to_string())
        slower, lines = self.slower(), self.lines()
        for line in lines[:len(lines) - len(slower)]:
            print(line)
        for stage, line in zip(slower, lines[len(lines) - len(slower):]):
            print("\n" + line)
            if stage in self.causes:
                print(self.causes[stage].round(1).to_string())


def profile_side_by_side(runs: dict[str, tuple[Callable[[], object], int]], device: torch.device | str, *,
                         steps: int = 2, top: int = 8) -> pd.DataFrame:
    """Two end-to-end steps profiled side by side: each operator's self time per image (µs) in the
    first (``{label: (run, images per step)}``) and the second, and the change, largest first
    (``top`` rows, and the total of every operator), over ``steps`` steps of each taken in turn. On
    CUDA the device's time, else the CPU's."""
    device = torch.device(device)
    per: dict[str, dict[str, float]] = {label: {} for label in runs}
    for run, _ in runs.values():
        run()  # a first step outside the profile: no warm-up in it
    for _ in range(steps):  # one step of each in turn, as the rounds ran them: paired here too
        for label, (run, images) in runs.items():
            with measure.profiler(device) as prof:
                run()
                measure.sync(device)
            for event in prof.key_averages():
                us = event.self_device_time_total if device.type == "cuda" else event.self_cpu_time_total
                per[label][event.key] = per[label].get(event.key, 0.0) + us / steps / images
    cols = {f"{label}, µs/image": pd.Series(ops, dtype=float) for label, ops in per.items()}
    frame = pd.DataFrame(cols).fillna(0.0)
    frame["change, µs/image"] = frame.iloc[:, 1] - frame.iloc[:, 0]
    total = frame.sum().rename("total (every operator)")
    frame = frame.reindex(frame["change, µs/image"].abs().sort_values(ascending=False).index).head(top)
    return pd.concat([frame, total.to_frame().T])


def _graph_counts() -> dict:
    """Dynamo's counters since they were last cleared: graphs made, graph breaks and their reasons."""
    from torch._dynamo.utils import counters  # Dynamo's own tally (what torch._dynamo.explain reads)

    breaks = counters["graph_break"]
    return {"graphs": int(counters["stats"]["unique_graphs"]), "graph_breaks": int(sum(breaks.values())),
            "reasons": [str(reason)[:120] for reason in list(breaks)[:3]]}


@dataclass
class _Built:
    stage: str
    run: Callable[[], object]  # one end-to-end step: wait for a batch, copy it, train
    step: train.TrainStep
    batch: int


def _build(lab, stages: list[str], not_timed: dict[str, str]) -> list[_Built]:
    """Each rung of ``stages`` as the grader builds it, from the code 02-05's checks carried forward
    (a rung whose code is missing or raises is left out, with why). Loaders of the same code at the
    same batch are made once and shared (02's decodes the split: one copy, not four)."""
    from . import StudentCodeError, carried, rungs

    code_cache: dict[str, dict] = {}
    loaders: dict = {}

    def code(number: str) -> dict:
        if number not in code_cache:
            code_cache[number] = {} if number == "01" else dict(vars(carried(number, lab)))
        return code_cache[number]

    def shared(make):
        def loader(at):
            key = (make, at.profile)
            if key not in loaders:
                loaders[key] = make(at)
            return loaders[key]
        return loader

    built = []
    for stage in stages:
        nb = notebooks.by_stage(stage)
        try:
            at = rungs.rung_lab(rungs.of(nb.number), lab)
            made = rungs.recipe(nb.number, code, at)
            loader, step = dataclasses.replace(made, loader=shared(made.loader)).build(at)
        except StudentCodeError as err:
            not_timed[stage] = str(err)
            continue
        except Exception as err:  # the carried code broke here: said, and the ladder goes on
            not_timed[stage] = f"your carried code raised {type(err).__name__}: {str(err)[:200]}"
            continue
        naive = nb.builds_on is None  # the baseline logs loss.item() every step, as measure_rung times it
        run = train.pipeline_step(pipeline.forever(loader), step, non_blocking=not naive, item_every_step=naive)
        built.append(_Built(stage, run, step, at.profile.batch_size))
    return built


def ladder(lab, lad=None, *, rounds: int | None = None, steps_per_round: int | None = None,
           progress: bool = True) -> PairedLadder:
    """Every rung of ``lad`` (default: every rung of the ladder) timed in this process, in interleaved
    rounds (default: twice the profile's ``rounds`` and more, of half its ``steps_per_round``), each
    rung built from the carried code; a rung slower than the one it builds on is profiled beside it."""
    from .. import report
    from ..report import RUNGS

    stages = [s for s, _ in RUNGS if lad is None or s in set(lad.rows.get("stage", []))]
    not_timed: dict[str, str] = {}
    load = {"before": load_average()}
    built = _build(lab, stages, not_timed)
    compiled = {}
    for b in list(built):  # warm up; a compiled rung's first step compiles, timed, with Dynamo's counts
        try:
            if b.step.config.compiled:
                from torch._dynamo.utils import counters
                counters.clear()
                compiled[b.stage] = {"compile_s": measure.one_off_s(b.run, lab.device), **_graph_counts()}
            for _ in range(max(1, lab.profile.warmup_steps)):
                b.run()
        except Exception as err:  # the carried code broke here: said, and the ladder goes on without it
            not_timed[b.stage] = f"its step raised {type(err).__name__}: {str(err)[:200]}"
            built.remove(b)
    # Short blocks and many rounds: each ratio is read over seconds, not minutes, and the median of
    # many rounds sheds the ones a burst of other work fell into (as many steps as the profile's pairs).
    steps = steps_per_round or max(1, lab.profile.steps_per_round // 2)
    seconds, orders = time_rounds({b.stage: b.run for b in built}, lab.device,
                                  rounds=rounds or 2 * lab.profile.rounds + 1, steps_per_round=steps,
                                  progress=progress)
    per_image = {b.stage: tuple(s / (steps * b.batch) for s in seconds[b.stage]) for b in built}
    labels = {s: label for s, label in RUNGS}
    result = PairedLadder(tuple(b.stage for b in built), {s: labels[s] for s in stages},
                          {s: notebooks.by_stage(s).builds_on for s in stages}, per_image, tuple(orders), steps,
                          load, not_timed, compiled)
    load["after"] = load_average()
    by_stage = {b.stage: b for b in built}
    for stage in result.slower():
        base, rung = by_stage[result.builds_on[stage]], by_stage[stage]
        result.causes[stage] = profile_side_by_side(
            {labels[base.stage]: (base.run, base.batch), labels[stage]: (rung.run, rung.batch)}, lab.device)
    report.keep_paired(result.table(None if lad is None else lad.rows), result.lines())
    return result
