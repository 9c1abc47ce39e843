"""The optimisation ladder: every stage recorded by notebooks 01-05, as a table, plots and HTML.

:func:`ladder` reads the results store, keeps the rungs measured on this machine (a stage that
was not recorded, or was recorded elsewhere, is listed with the notebook to run, never raised as
a stack trace) and builds the ladder table with an ``assemble`` function: the student's own
``assemble_ladder`` from 06 (the instructor's commands pass the reference's). Columns: samples/s,
speedup (cumulative), speedup (this rung: against the rung it builds on), peak MiB, accuracy %.
:func:`export_html` writes the whole report as one self-contained HTML page (plots embedded as
PNG data, readable on a phone): per rung its throughput with spread, speedups, time breakdown,
memory, accuracy and the change it made; the graded checks; the published case-study ladder
beside the student's; and the student's written analysis. Students and instructors both use it.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import hardware, notebooks, results

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

# The published ladder this lab follows, for comparison (design brief): ResNet-50 on a data-centre
# GPU, each rung's cumulative speedup. Another model on other hardware: compare shapes, not values.
CASE_STUDY = (("baseline", 1.0), ("+workers", 1.4), ("+AMP", 1.9), ("+larger batch", 2.3), ("+compile", 2.8))
CASE_STUDY_HARDWARE = "ResNet-50 training on an NVIDIA data-centre GPU (the case study this lab follows)"


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


def _where(machine: dict) -> str:
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
            elsewhere[stage] = _where(rec["machine"])
            missing.append(f"{stage} ({label}): recorded on {elsewhere[stage]}, not on this machine; run "
                           f"{results.notebook_for(stage)} here, or ls.report.measure_here(lab, [{stage!r}]) "
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
    from . import measure, memory, pipeline, train

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


def measure_here(lab, stages) -> dict[str, str]:
    """Measure the rungs ``stages`` again on this machine, from the student's carried code, and
    record them; returns ``{stage: what happened}``.

    Rungs measured on different machines do not compare, and Colab gives every notebook a new
    runtime, often another machine: 06 measures each rung recorded elsewhere again here, exactly
    as the grader measures rungs (:func:`labsupport.grading.rungs.measure`: the naive baseline, or
    the code 02-05's checks carried forward). The new record keeps where the rung was first
    measured (``first_measured_on``) and the accuracy its first record held (03's training run,
    which is not repeated here); the figures 02-05's checks measured beside their rung were
    measured there, not here, and are left out.
    """
    from . import notebooks
    from .grading import StudentCodeError, carried, rungs

    done = {}
    for stage in stages:
        number = notebooks.by_stage(stage).number
        try:
            first = results.load(stage)
        except results.ResultsError:
            first = None
        try:
            namespace = {} if number == "01" else dict(vars(carried(number, lab)))
            rungs.measure(number, namespace, lab, {})
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
            results.record(stage, {**record["metrics"], **kept, "first_measured_on": _where(first["machine"])},
                           config=record["config"], machine=record["machine"], profile=record["profile"])
        done[stage] = "measured again here"
    return done


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


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


def roofline_html(lad: Ladder) -> list[str]:
    """The report's roofline section (:func:`labsupport.roofline.html_section`), where the rungs were
    measured on this machine (the peak is this machine's); else nothing."""
    from . import roofline as roof
    from .hardware import describe_machine

    here = describe_machine()
    if not lad.machine or not hardware.same_machine(lad.machine, here.as_dict()):
        return []
    return roof.html_section(lad, roof.peaks(here.device, lad.machine, roof.wanted(lad), lad.directory), _table)


def roofline(lad: Ladder, device: "torch.device | str", peaks: dict[str, dict] | None = None) -> pd.DataFrame:
    """How close each rung's step runs to what ``device`` can do (:func:`labsupport.roofline.table`):
    its FLOP/s against the theoretical peak in its dtype, beside the best kernel measured. ``peaks``
    (default: :func:`labsupport.roofline.peaks`, measured once per run and kept in the ladder's
    results store, so ``make run``'s table and this report read one value) gives them by dtype."""
    import torch

    from . import hardware, roofline as roof

    hardware.quiet_library_logs(torch.device(device))  # torch.utils.benchmark's import warns off CUDA
    if peaks is None:
        peaks = roof.peaks(device, lad.machine, roof.wanted(lad), lad.directory)
    return roof.table(lad, peaks)


def phases(lad: Ladder) -> pd.DataFrame:
    """Milliseconds per phase of a rung's step, adding up to the step time the ladder gives it.

    The breakdown (:func:`labsupport.train.phase_breakdown`) runs on the rung's own step and loader
    right after its timed steps, synchronising at every phase boundary: its *shares* are what it
    measures (:class:`labsupport.measure.PhaseClock`), so each share is drawn on the rung's timed
    median step, and a breakdown whose stamped steps took far longer or shorter than the timed ones
    is named in :func:`phase_mismatches`. A rung without a median step, or timed from outside by the
    grader's judge (its data wait only), keeps its stamped times.
    """
    from .train import PHASES

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
    from .train import PHASES

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


def case_study(lad: Ladder) -> pd.DataFrame:
    """The published case-study ladder beside this run's cumulative speedups, rung by rung."""
    mine = lad.table["speedup (cumulative)"] if "speedup (cumulative)" in lad.table else pd.Series(dtype=float)
    n = max(len(CASE_STUDY), len(mine))
    cell = lambda seq, i: seq[i] if i < len(seq) else None  # noqa: E731
    return pd.DataFrame({"published rung": [cell([r for r, _ in CASE_STUDY], i) for i in range(n)],
                         "published speedup": [cell([v for _, v in CASE_STUDY], i) for i in range(n)],
                         "your rung": [cell(list(mine.index), i) for i in range(n)],
                         "your speedup": [cell(list(mine.values), i) for i in range(n)]})


def plots(lad: Ladder) -> dict[str, object]:
    """The report's matplotlib figures: the ladder with its spread, where each rung's time goes,
    memory against throughput, and the case study beside this run.

    Built with ``matplotlib.figure.Figure`` rather than pyplot, so no GUI backend or global figure
    state is involved: the same code works in a notebook, a terminal and a headless grader.
    """
    from matplotlib.figure import Figure

    figures = {}
    t = lad.table
    if t.empty or "samples/s" not in t:
        return figures
    details = rung_details(lad)
    fig = Figure(figsize=(7, 3.6))
    ax = fig.subplots()
    spread = None
    if not details.empty and {"step ms (median)", "batch"} <= set(details):
        iqr = lad.rows.set_index(lad.rows["stage"].map(dict(RUNGS)))
        if "iqr_ms" in iqr and "median_ms" in iqr:
            lo = iqr["batch"] / (iqr["median_ms"] + iqr["iqr_ms"] / 2) * 1000
            hi = iqr["batch"] / (iqr["median_ms"] - iqr["iqr_ms"] / 2).clip(lower=1e-9) * 1000
            med = t["samples/s"]
            spread = [(med - lo.reindex(t.index)).clip(lower=0).fillna(0)[::-1],
                      (hi.reindex(t.index) - med).clip(lower=0).fillna(0)[::-1]]
    bars = ax.barh(t.index[::-1], t["samples/s"][::-1], color="#4c72b0", xerr=spread, capsize=3)
    if t.get("speedup (cumulative)") is not None and t["speedup (cumulative)"].notna().any():
        ax.bar_label(bars, labels=[f"{v:.2f}x" if pd.notna(v) else "" for v in t["speedup (cumulative)"][::-1]],
                     padding=6)
    ax.set(xlabel="training samples/s, end to end (whiskers: IQR of step times)", title="The optimisation ladder")
    figures["ladder"] = fig
    ph = phases(lad)
    if not ph.empty:
        fig = Figure(figsize=(7, 3.6))
        ax = fig.subplots()
        left = pd.Series(0.0, index=ph.index)
        colours = ("#dd8452", "#937860", "#4c72b0", "#55a868", "#8172b3")
        for phase, colour in zip(ph.columns, colours):
            ax.barh(ph.index[::-1], ph[phase][::-1], left=left[::-1], label=phase, color=colour)
            left += ph[phase].fillna(0)
        ax.set(xlabel="ms per step: the rung's median step, split by its measured phase shares",
               title="Where a step's time goes")
        # Below the axes, not on them: inside, it covered the end of the longest bar.
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=len(ph.columns), fontsize="small",
                  frameon=False)
        figures["breakdown"] = fig
    mem = t.dropna(subset=["peak MiB"]) if "peak MiB" in t else pd.DataFrame()
    if not mem.empty:
        fig = Figure(figsize=(6, 3.6))
        ax = fig.subplots()
        # One marker and colour per rung, named in a legend: labels written beside the points
        # overlapped where two rungs sit close (+data beside the baseline; issue 63).
        markers, colours = "osD^v", ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3")
        for i, (label, row) in enumerate(mem.iterrows()):
            ax.scatter(row["samples/s"], row["peak MiB"], marker=markers[i % 5], color=colours[i % 5], s=50,
                       label=label)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
        ax.margins(0.15)
        ax.set(xlabel="samples/s", ylabel="peak memory of a step (MiB)", title="Memory against throughput")
        figures["memory"] = fig
    if "speedup (cumulative)" in t and t["speedup (cumulative)"].notna().any():
        fig = Figure(figsize=(6, 3.4))
        ax = fig.subplots()
        ax.plot(range(len(CASE_STUDY)), [v for _, v in CASE_STUDY], "o--", color="gray",
                label="published (ResNet-50, data-centre GPU)")
        ax.plot(range(len(t)), t["speedup (cumulative)"], "o-", color="#4c72b0",
                label=f"yours (ResNet-18, {lad.machine.get('device_class', 'this machine')})")
        ax.set(xlabel="rung", ylabel="cumulative speedup", title="Your ladder and the case study's")
        ax.set_xticks(range(max(len(t), len(CASE_STUDY))))
        ax.legend(fontsize="small")
        figures["case study"] = fig
    return figures


def analysis_from_notebook(path: Path | str = "06_report.ipynb", grade_id: str = "analysis") -> str:
    """The student's written analysis: the markdown cell ``grade_id`` of their 06 notebook ("" if
    the notebook is not beside the kernel, as in Colab, where the report says so)."""
    import json

    try:
        cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError):
        return ""
    for cell in cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            source = cell.get("source", "")
            return "".join(source) if isinstance(source, list) else source
    return ""


def _table(frame: pd.DataFrame, css: str, **kw) -> str:
    """A DataFrame as an HTML table that scrolls sideways on a narrow screen instead of overflowing."""
    return f'<div class="scroll">{frame.to_html(classes=css, na_rep="", **kw)}</div>'


def export_html(path: Path | str, lad: Ladder, *, title: str = "PyTorch Performance Lab: report",
                checks: pd.DataFrame | None = None, analysis: str | None = None,
                extra: dict[str, pd.DataFrame] | None = None) -> Path:
    """Write the comparison report of ladder ``lad`` as one self-contained HTML page; return its path.

    Sections: the machine; the ladder (the ``assemble`` table) and each rung's details (change,
    spread, step time, memory, accuracy); plots (the ladder with spread, the time breakdown,
    memory, the case study); the published case-study ladder beside this one; the graded checks
    (``checks``, default: every notebook's kept table in the results store); the written
    ``analysis`` (default: read from ``06_report.ipynb`` beside the kernel); missing stages.
    Tables are HTML and plots PNG data URIs: the page opens offline, anywhere, at any width.
    """
    from .grading import kept_checks

    figures = plots(lad)
    checks = kept_checks() if checks is None else checks
    analysis = analysis_from_notebook() if analysis is None else analysis
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p>Generated {dt.datetime.now().isoformat(timespec='seconds')}.</p>"]
    if lad.machine:
        machine = pd.Series(lad.machine, name="value").to_frame()
        parts += ['<h2 id="machine">Machine</h2>', _table(machine, "machine")]
    parts.append('<h2 id="ladder">The ladder</h2>')
    if lad.table.empty:
        parts.append("<p>No stage has been recorded yet.</p>")
    else:
        parts.append(_table(lad.table.drop(columns=["stage"], errors="ignore"), "ladder",
                            float_format=lambda v: f"{v:,.2f}"))
        parts.append(f"<p><small>Empty cells were not measured. {html.escape(LADDER_NOTE)}</small></p>")
        details = rung_details(lad)
        if not details.empty:
            parts += ['<h2 id="rungs">Each rung: what changed, spread, memory</h2>',
                      _table(details, "rungs", float_format=lambda v: f"{v:,.1f}")]
        parts += roofline_html(lad)
    if lad.missing:
        parts += ['<h2 id="missing">Missing stages</h2>', "<ul>"] + \
                 [f"<li>{html.escape(m)}</li>" for m in lad.missing] + ["</ul>"]
    if figures:
        parts.append('<h2 id="plots">Plots</h2>')
    for name, fig in figures.items():
        parts.append(figure_html(fig, f"{name} plot"))
        if name == "breakdown" and phase_mismatches(lad):
            parts.append("<p><small>Breakdowns measured off their step's time: " +
                         "; ".join(html.escape(m) for m in phase_mismatches(lad)) + ".</small></p>")
    parts += ['<h2 id="case-study">The published ladder beside yours</h2>',
              f"<p>{html.escape(CASE_STUDY_HARDWARE)}: compare the shape of the two ladders, not their "
              "values.</p>", _table(case_study(lad), "case-study", index=False, float_format=lambda v: f"{v:.2f}x")]
    parts.append('<h2 id="checks">Graded checks</h2>')
    if checks.empty:
        parts.append("<p>No graded checks were run yet: run each notebook's \"Check your work\" cell.</p>")
    else:
        parts.append(_table(checks, "checks", index=False))
    parts.append('<h2 id="inference">Inference: pruning and int8 (07)</h2>')
    found = inference()
    if isinstance(found, str):
        parts.append(f"<p>{html.escape(found)}</p>")
    else:
        parts += [_table(found, "inference", float_format=lambda v: f"{v:,.2f}"),
                  f"<p><small>{html.escape(INFERENCE_NOTE)}</small></p>"]
    for name, frame in (extra or {}).items():
        parts += [f"<h2>{html.escape(name)}</h2>", _table(frame, "extra")]
    parts.append('<h2 id="analysis">Analysis</h2>')
    parts.append(f'<div class="analysis">{markdown_html(analysis)}</div>' if analysis.strip() else
                 "<p>The written analysis is in 06_report.ipynb (its notebook was not beside the kernel "
                 "that exported this page).</p>")
    return write_page(path, title, parts)


def markdown_html(text: str) -> str:
    """The student's Markdown as HTML (mistune, nbconvert's own renderer), raw HTML in it escaped:
    a report an instructor opens never runs a script a student typed."""
    import mistune

    return mistune.create_markdown(escape=True, plugins=["table", "strikethrough"])(text)


INFERENCE_STAGE = "07-inference"
INFERENCE_NOTE = ("Not a rung of the ladder: inference, not training. Measured on the CPU at 32 px, per "
                  "request of 32 images, each model compiled the lab's way (torch.compile, freezing on) and also run eagerly; "
                  "accuracy on the validation split. Sizes are the bytes of the tensors each model runs on.")


def inference(directory: Path | str | None = None) -> pd.DataFrame | str:
    """07's table (fp32, pruned, int8: size, latency percentiles, accuracy), or a sentence saying
    which notebook records it."""
    try:
        rec = results.load(INFERENCE_STAGE, Path(directory) if directory else None)
    except results.ResultsError as err:
        return (f"Not recorded yet: {err} 07 comes after this notebook; its last cell exports this "
                "report again with this section.")
    return pd.DataFrame(rec["metrics"]["models"]).set_index("model")


def figure_html(fig, alt: str) -> str:
    """A matplotlib figure as an ``<img>`` with the PNG embedded (no file, no network)."""
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{_png(fig)}"></figure>'


def write_page(path: Path | str, title: str, parts: list[str]) -> Path:
    """Write one self-contained HTML page of ``parts`` (HTML snippets) with the report's style.
    """
    style = ("body{font-family:system-ui,sans-serif;max-width:75em;margin:1em auto;padding:0 1em;color:#222}"
             ".scroll{overflow-x:auto}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}"
             "th{background:#f3f3f3}"
             "img{max-width:100%;height:auto}figure{margin:1em 0}"
             # Each rung's details table needs about 1,000 px (issue 63: at 60em its last column was
             # cut off at 1280 px): the page is 75em wide and cells wrap at spaces; a phone scrolls it.
             "table{max-width:100%}td,th{overflow-wrap:break-word}.dataframe{font-size:.9em}"
             ".analysis code{background:#f3f3f3;padding:0 .2em}")
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(title)}</title><style>{style}</style></head><body>{''.join(parts)}</body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def default_path() -> Path:
    """Where the notebook's HTML report goes (:func:`labsupport.paths.report_path`)."""
    from .paths import report_path

    return report_path()
