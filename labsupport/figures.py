"""The report's figures: the ladder with its spread, where a step's time goes, memory against
throughput, and the published case study beside this run, as matplotlib figures and as HTML.

Built with ``matplotlib.figure.Figure`` rather than pyplot, so no GUI backend or global figure
state is involved: the same code works in a notebook, a terminal and a headless grader.
Re-exported by :mod:`labsupport.report` (``ls.report.plots``, ``ls.report.figure_html``).
"""

from __future__ import annotations

import base64
import html
import io

import pandas as pd

from .ladder import RUNGS, Ladder, phases, rung_details

# The published ladder this lab follows, for comparison (design brief): ResNet-50 on a data-centre
# GPU, each rung's cumulative speedup. Another model on other hardware: compare shapes, not values.
CASE_STUDY = (("baseline", 1.0), ("+workers", 1.4), ("+AMP", 1.9), ("+larger batch", 2.3), ("+compile", 2.8))
CASE_STUDY_HARDWARE = "ResNet-50 training on an NVIDIA data-centre GPU (the case study this lab follows)"


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


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def figure_html(fig, alt: str) -> str:
    """A matplotlib figure as an ``<img>`` with the PNG embedded (no file, no network)."""
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{_png(fig)}"></figure>'
