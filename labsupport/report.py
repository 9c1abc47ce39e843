"""The comparison report: the ladder of notebooks 01-05, its figures, 07's table and the analysis, as one HTML page.

:func:`export_html` writes the whole report as one self-contained HTML page (plots embedded as
PNG data, readable on a phone): per rung its throughput with spread, speedups, time breakdown,
memory, accuracy and the change it made; how close each rung runs to the machine's limit; the
graded checks; the published case-study ladder beside the student's; 07's inference table; and
the student's written analysis. Students and instructors both use it.

What it is made of lives below it, each reachable here as ``ls.report.X``: the ladder, each rung
timed and recorded (:mod:`labsupport.ladder`: ``ladder``, ``measure_rung``, ``RUNGS``, ...) and
the figures (:mod:`labsupport.figures`: ``plots``, ``figure_html``, ``case_study``). A rung
recorded on another machine is measured again here with the grader's own measurement by
``ls.paired.measure_here`` (:func:`labsupport.grading.rungs.measure_here`), above this module.
"""

from __future__ import annotations

import datetime as dt
import html
import json
from pathlib import Path

import pandas as pd

from . import hardware, results
from .figures import CASE_STUDY, CASE_STUDY_HARDWARE, case_study, figure_html, plots
from .ladder import (COLUMNS, LADDER_NOTE, PHASE_MISMATCH, RUNGS, SETUP_DTYPES, SETUP_SIZES, Ladder, ladder,
                     measure_rung, phase_mismatches, phases, rung_details)

__all__ = ["CASE_STUDY", "CASE_STUDY_HARDWARE", "COLUMNS", "INFERENCE_NOTE", "INFERENCE_STAGE", "LADDER_NOTE",
           "PHASE_MISMATCH", "RUNGS", "SETUP_DTYPES", "SETUP_SIZES", "Ladder", "analysis_from_notebook",
           "case_study", "default_path", "export_html", "figure_html", "inference", "ladder", "markdown_html",
           "measure_rung", "phase_mismatches", "phases", "plots", "roofline", "roofline_html",
           "rung_details", "keep_paired", "paired_html", "write_page"]


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
    ``analysis`` (default: read from ``06_report.ipynb`` beside the kernel); missing stages; and,
    where 06 measured it (:func:`keep_paired`, in the ladder's results store), the same rungs timed
    again in one process, interleaved, beside each notebook's own figure, with the load it ran
    under and the measured cause of any rung slower than the one it builds on.
    Tables are HTML and plots PNG data URIs: the page opens offline, anywhere, at any width.
    """
    figures = plots(lad)
    checks = results.kept_checks() if checks is None else checks
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
        parts += paired_html(lad.directory)
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


PAIRED_FILE = Path("paired") / "ladder.json"


def keep_paired(table: pd.DataFrame, lines: list[str], directory: Path | str | None = None) -> Path:
    """Keep 06's paired ladder (its table and what goes with it: ``ls.paired.ladder``) in the results
    store, for every report page exported from it; returns the file."""
    path = Path(directory or results.results_dir()) / PAIRED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"table": json.loads(table.to_json(orient="split")), "lines": list(lines),
                                "kept_at": dt.datetime.now().isoformat(timespec="seconds")}))
    return path


def paired_html(directory: Path | str | None = None) -> list[str]:
    """The report's paired-ladder section, from what :func:`keep_paired` kept (none: nothing)."""
    path = Path(directory or results.results_dir()) / PAIRED_FILE
    if not path.is_file():
        return []
    kept = json.loads(path.read_text())
    table = pd.DataFrame(**kept["table"])
    return (['<h2 id="paired">The same ladder, paired</h2>',
             f"<p>Every rung timed again in one process (06, {html.escape(kept['kept_at'])}), in interleaved "
             "rounds: each ratio is read inside one round, on one state of the machine.</p>",
             _table(table, "paired"), "<ul>"]
            + [f"<li>{html.escape(line)}</li>" for line in kept["lines"]] + ["</ul>"])


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
