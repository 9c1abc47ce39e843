"""The optimisation ladder: every stage recorded by notebooks 01-05, as a table, plots and HTML.

:func:`ladder` reads the results store and builds one row per rung (baseline, +data loading,
+AMP, +memory, +compile) with throughput, speedups, peak memory and accuracy. A stage that was
not recorded, or was recorded on another machine, is listed with the notebook to run, never
raised as a stack trace. :func:`export_html` writes the whole report as one self-contained
HTML file (plots embedded as PNG data), the single call students and instructors both use.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import results

# The ladder's rungs, in order: (stage recorded in the results store, rung label).
RUNGS = (
    ("01-baseline", "baseline"),
    ("02-data", "+data loading"),
    ("03-amp", "+AMP"),
    ("04-memory", "+memory (larger batch)"),
    ("05-compile", "+compile"),
)

# Why some cells of the ladder are empty (printed under the table by `make run` and the report).
LADDER_NOTE = ("Peak memory is counted on every rung except a compiled step off CUDA, where the "
               "counting runs it eagerly. Accuracy comes from 03's training run, fp32 against "
               "16-bit; 04 and 05 check correctness by comparing gradients and outputs instead.")


@dataclass
class Ladder:
    """The ladder table and what is missing from it (Used by: 06 and the instructor's report)."""

    table: pd.DataFrame  # one row per recorded rung, indexed by rung label
    missing: list[str] = field(default_factory=list)  # "stage: why, and which notebook to run"
    machine: dict = field(default_factory=dict)  # the machine the rungs were measured on


def _same_machine(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("device_class", "device_name"))


def ladder(directory: Path | str | None = None, machine: dict | None = None) -> Ladder:
    """Build the ladder from the results store (Used by: 06).

    ``machine`` (default: the baseline's) is the machine every rung must come from; a rung
    recorded elsewhere is left out and listed in ``missing``.
    """
    records, missing = {}, []
    for stage, label in RUNGS:
        try:
            records[stage] = results.load(stage, Path(directory) if directory else None)
        except results.ResultsError as err:
            missing.append(f"{stage} ({label}): {err}")
    if machine is None and records:
        machine = next(iter(records.values()))["machine"]
    rows = []
    for stage, label in RUNGS:
        rec = records.get(stage)
        if rec is None:
            continue
        if machine and not _same_machine(rec["machine"], machine):
            missing.append(f"{stage} ({label}): recorded on {rec['machine'].get('device_name')} "
                           f"({rec['machine'].get('device_class')}), not on this machine; run "
                           f"{results.notebook_for(stage)} here.")
            continue
        rows.append({"stage": stage, "batch": (rec.get("profile") or {}).get("batch_size"), **rec["metrics"]})
    table = ladder_from_frame(pd.DataFrame(rows))
    return Ladder(table, missing, machine or {})


def ladder_from_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The ladder table from results rows (``results.load_all()``): one row per rung, in order.

    Columns: samples/s, speedup (cumulative, against the baseline), speedup (this rung, against
    the rung before), peak MiB, accuracy %. Used by: ladder() and the 06 check of the student's
    ``assemble_ladder``.
    """
    labels = dict(RUNGS)
    cols = ["stage", "batch", "samples/s", "speedup (cumulative)", "speedup (this rung)", "peak MiB", "accuracy %"]
    if frame.empty:
        return pd.DataFrame(columns=cols)
    rows = frame[frame["stage"].isin(labels)].set_index("stage").reindex([s for s, _ in RUNGS]).dropna(
        subset=["samples_per_s"])
    get = lambda name: rows[name] if name in rows else pd.Series(float("nan"), index=rows.index)  # noqa: E731
    table = pd.DataFrame({"stage": rows.index, "batch": get("batch"), "samples/s": rows["samples_per_s"]},
                         index=rows.index)
    base = rows["samples_per_s"].get("01-baseline", float("nan"))
    table["speedup (cumulative)"] = table["samples/s"] / base
    table["speedup (this rung)"] = table["samples/s"] / table["samples/s"].shift(1)
    table["batch"] = table["batch"].astype("Int64")
    table["peak MiB"] = get("peak_bytes") / 2**20
    table["accuracy %"] = 100 * get("accuracy")
    table.index = [labels[s] for s in table.index]
    return table[cols]


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def plots(lad: Ladder) -> dict[str, object]:
    """The report's matplotlib figures: the ladder bar chart and memory against throughput.

    Built with ``matplotlib.figure.Figure`` rather than pyplot, so no GUI backend or global figure
    state is involved: the same code works in a notebook, a terminal and a headless grader.
    """
    from matplotlib.figure import Figure

    figures = {}
    t = lad.table
    if t.empty:
        return figures
    fig = Figure(figsize=(7, 3.6))
    ax = fig.subplots()
    bars = ax.barh(t.index[::-1], t["samples/s"][::-1], color="#4c72b0")
    if t.get("speedup (cumulative)") is not None and t["speedup (cumulative)"].notna().any():
        ax.bar_label(bars, labels=[f"{v:.2f}x" if pd.notna(v) else "" for v in t["speedup (cumulative)"][::-1]],
                     padding=3)
    ax.set(xlabel="training samples/s (end to end)", title="The optimisation ladder")
    figures["ladder"] = fig
    mem = t.dropna(subset=["peak MiB"])
    if not mem.empty:
        fig = Figure(figsize=(6, 3.6))
        ax = fig.subplots()
        ax.scatter(mem["samples/s"], mem["peak MiB"], color="#dd8452")
        for label, row in mem.iterrows():
            ax.annotate(label, (row["samples/s"], row["peak MiB"]), textcoords="offset points", xytext=(5, 4))
        ax.set(xlabel="samples/s", ylabel="peak memory of a step (MiB)", title="Memory against throughput")
        figures["memory"] = fig
    return figures


def export_html(path: Path | str, directory: Path | str | None = None, *, title: str = "PyTorch Performance Lab: report",
                extra: dict[str, pd.DataFrame] | None = None, analysis: str = "") -> Path:
    """Write the comparison report as one self-contained HTML file and return its path (Used by: 06).

    Tables are HTML, plots are PNG embedded as data URIs: the file opens offline, anywhere.
    ``extra`` adds named tables (e.g. the graded checks), ``analysis`` a written paragraph.
    """
    lad = ladder(directory)
    figures = plots(lad)
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p>Generated {dt.datetime.now().isoformat(timespec='seconds')}.</p>"]
    if lad.machine:
        machine = pd.Series(lad.machine, name="value").to_frame()
        parts += ["<h2>Machine</h2>", machine.to_html(classes="machine")]
    parts.append("<h2>The ladder</h2>")
    if lad.table.empty:
        parts.append("<p>No stage has been recorded yet.</p>")
    else:
        parts.append(lad.table.drop(columns=["stage"]).to_html(float_format=lambda v: f"{v:,.2f}",
                                                               na_rep="", classes="ladder"))
        parts.append(f"<p><small>Empty cells were not measured. {html.escape(LADDER_NOTE)}</small></p>")
    if lad.missing:
        parts += ["<h2>Missing stages</h2>", "<ul>"] + \
                 [f"<li>{html.escape(m)}</li>" for m in lad.missing] + ["</ul>"]
    for name, fig in figures.items():
        parts.append(figure_html(fig, f"{name} plot"))
    for name, frame in (extra or {}).items():
        parts += [f"<h2>{html.escape(name)}</h2>", frame.to_html(na_rep="", classes="extra")]
    if analysis:
        parts += ["<h2>Analysis</h2>", f"<p>{html.escape(analysis)}</p>"]
    return write_page(path, title, parts)


def figure_html(fig, alt: str) -> str:
    """A matplotlib figure as an ``<img>`` with the PNG embedded (no file, no network)."""
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{_png(fig)}"></figure>'


def write_page(path: Path | str, title: str, parts: list[str]) -> Path:
    """Write one self-contained HTML page of ``parts`` (HTML snippets) with the report's style.

    Used by: export_html and the instructor's class summary (autograder/reports.py).
    """
    style = ("body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;"
             "text-align:right}th{background:#f3f3f3}img{max-width:100%}")
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def default_path() -> Path:
    """Where the notebook's HTML report goes: ``LAB_REPORT``, else ``./build/report.html`` (Used by: 06)."""
    import os

    return Path(os.environ.get("LAB_REPORT", Path("build") / "report.html"))


def optimised_config(machine):
    """The fully optimised training step of the ladder on ``machine`` (Used by: 06's end-to-end check).

    16-bit autocast with channels_last where the hardware is fast in 16 bits (fp16 with a
    GradScaler on GPUs, bf16 on CPUs with bf16 units; :func:`~labsupport.hardware.autocast_dtype`),
    and torch.compile where it pays for training: on CUDA. On a CPU compile made the training step
    no faster (05), and the larger checkpointed batch bought memory, not speed (04), so neither is
    in the CPU's optimised step; on a CPU without bf16 units it stays in float32.
    """
    from .hardware import Machine, autocast_dtype
    from .train import StepConfig

    if not isinstance(machine, Machine):
        raise TypeError(f"optimised_config takes lab.machine, not {machine!r}")
    dtype = autocast_dtype(machine)
    if dtype is None:
        return StepConfig()
    return StepConfig(amp_dtype=dtype, grad_scaler=dtype == "float16", channels_last=True,
                      compiled=machine.device == "cuda")
