"""``report``: a student's (or the reference's) comparison report, and the class summary, as HTML.

Both are made with the lab's own report code (labsupport/report.py), so an instructor sees the
page a student exported, built from the measurements taken on the grading machine:

- a student's report reads ``results/<student>/`` (written while grade ran their notebooks) and
  adds their scores per graded cell;
- the reference's reads ``build/run/results`` (written by ``make run``);
- the class summary reads ``grades_by_check.csv``, ``grading_summary.csv`` and every student's
  results: the distribution of the measured speedups per rung, and the scores per check.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from . import course


JUDGE_HEADING = "The grader's verdicts"


def judged_feedback(where: course.Course | Path, student: str, notebook: str, decided: dict[str, dict],
                    problems: list[str] = ()) -> Path | None:
    """Put the grader's table (check, measured, bar, result, reason, note) at the top of
    ``notebook``'s feedback page, with what the grader noted beside it (``problems``), and label
    what follows as the student's own kernel run.

    The feedback page is nbgrader's rendering of the notebook as the student's kernel ran it: its
    self-check tables are the kernel's measurements, while each test cell's score is the grader's.
    Returns the page, or None where nbgrader wrote none (or there is nothing to add).
    """
    page = course.of(where).feedback(student) / f"{notebook}.html"
    if not decided or not page.is_file() or page.is_symlink():
        return None
    text = page.read_text()
    body = text.find("<body")
    if body < 0 or JUDGE_HEADING in text:
        return None
    at = text.index(">", body) + 1
    table = pd.DataFrame([{k: d.get(k) for k in ("check", "measured", "bar", "result", "reason", "note")}
                          for d in decided.values()])
    block = (f'<section class="grader-verdicts" style="margin:1em 2em;padding:0.5em 1em;border:2px solid #4c72b0">'
             f"<h2>{JUDGE_HEADING}</h2><p>Your points come from this table: the grader re-ran each check "
             "outside your kernel, on the code your checks carried forward, and decided it against this "
             "machine's bar. A result far above the reference waits for your instructor (\"review\").</p>"
             + table.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.3g}", escape=True)
             + ("<p>The grader noted:</p><ul>" + "".join(f"<li>{html.escape(p)}</li>" for p in problems) + "</ul>"
                if problems else "")
             + "<p><b>Below: your notebook as your own kernel ran it.</b> Its self-check tables are your "
               "kernel's own measurements (the student's self-check); where they differ from the table "
               "above, the grader's table decides.</p></section>")
    page.write_text(text[:at] + block + text[at:])
    return page


def _scores(the: course.Course) -> pd.DataFrame:
    path = the.root / "grades_by_check.csv"
    if not path.exists():
        raise course.CourseError(f"{path} does not exist: run `python -m autograder grade` first.")
    return pd.read_csv(path)


def student_report(where: course.Course | Path, student: str, out: Path | None = None) -> Path:
    """Export ``student``'s comparison report (their grading-time measurements) as HTML."""
    from labsupport import report

    the = course.of(where)
    results = the.results(student)
    if not results.is_dir():
        graded = sorted(p.name for p in (the.root / "results").glob("*") if p.is_dir())
        raise course.CourseError(f"No grading results for {student!r} in {results.parent}: grade them "
                                 f"first (graded so far: {', '.join(graded) or 'nobody'}).")
    scores = _scores(the)
    mine = scores[scores.student == student].drop(columns=["student"]).set_index(["notebook", "cell"])
    out = Path(out) if out else the.root / "reports" / f"{student}.html"
    from . import reference

    lad = report.ladder(results, assemble=reference.solutions("06").assemble_ladder)
    return report.export_html(out, lad, title=f"PyTorch Performance Lab: {student}",
                              extra={"Scores per graded cell": mine})


def reference_report(build: Path, out: Path | None = None) -> Path:
    """Export the reference run's report (``make run``'s results) as HTML."""
    from labsupport import report

    results = Path(build) / "run" / "results"
    if not results.is_dir():
        raise course.CourseError(f"{results} does not exist: run `make run` (python -m autograder run) first.")
    from . import reference

    lad = report.ladder(results, assemble=reference.solutions("06").assemble_ladder)
    return report.export_html(Path(out) if out else Path(build) / "report.html", lad,
                              title="PyTorch Performance Lab: reference solution")


def speedups(where: course.Course | Path) -> pd.DataFrame:
    """Cumulative speedup per rung (columns) per graded student (rows), from their results."""
    from labsupport import report

    from . import reference

    assemble = reference.solutions("06").assemble_ladder
    rows = {}
    for folder in sorted((course.of(where).root / "results").glob("*")):
        if folder.is_dir():
            table = report.ladder(folder, assemble=assemble).table
            rows[folder.name] = table["speedup (cumulative)"] if not table.empty else pd.Series(dtype=float)
    frame = pd.DataFrame(rows).T
    return frame.reindex(columns=[label for _, label in report.RUNGS if label in frame.columns])


def class_plots(scores: pd.DataFrame, ups: pd.DataFrame) -> dict[str, object]:
    """The class summary's figures: speedups per rung (one dot per student), share of points per check."""
    from matplotlib.figure import Figure

    figures = {}
    if not ups.empty and ups.notna().any().any():
        fig = Figure(figsize=(7, 3.6))
        ax = fig.subplots()
        for i, rung in enumerate(ups.columns):
            vals = ups[rung].dropna()
            ax.scatter([i] * len(vals), vals, alpha=0.6, color="#4c72b0")
            if len(vals):
                ax.hlines(vals.median(), i - 0.3, i + 0.3, color="#dd8452")
        ax.set_xticks(range(len(ups.columns)), ups.columns, rotation=20, ha="right")
        ax.set(ylabel="speedup against the baseline", title="Measured speedups per rung (median in orange)")
        figures["speedups"] = fig
    auto = scores[~scores.needs_manual_grade.astype(bool)] if "needs_manual_grade" in scores else scores
    if not auto.empty:
        per_cell = auto.groupby(["notebook", "cell"]).agg(score=("score", "sum"), max=("max_score", "sum"))
        share = (per_cell.score / per_cell["max"]).fillna(0)
        fig = Figure(figsize=(7, 0.3 * len(share) + 1))
        ax = fig.subplots()
        ax.barh([f"{n[:2]} {c}" for n, c in share.index][::-1], share.values[::-1], color="#55a868")
        ax.set(xlim=(0, 1), xlabel="share of the class's possible points", title="Scores per check")
        figures["scores"] = fig
    return figures


def class_report(where: course.Course | Path, out: Path | None = None) -> Path:
    """The class summary in one HTML file: scores per student and per check, speedup distributions."""
    from labsupport import report

    the = course.of(where)
    scores = _scores(the)
    summary_path = the.root / "grading_summary.csv"
    status = pd.read_csv(summary_path) if summary_path.exists() else pd.DataFrame()
    totals = scores.groupby("student").agg(score=("score", "sum"), max=("max_score", "sum"))
    if not status.empty:
        problems = status[status.status != "graded"].groupby("student").apply(
            lambda g: ", ".join(f"{n} {s}" for n, s in zip(g.notebook, g.status)), include_groups=False)
        totals["not graded normally"] = problems.reindex(totals.index).fillna("")
    per_check = scores.groupby(["notebook", "cell"]).agg(
        students=("student", "nunique"), mean=("score", "mean"), max=("max_score", "max"),
        full_marks=("score", lambda s: int((s == scores.loc[s.index, "max_score"]).sum())))
    ups = speedups(the)
    parts = [f"<h1>Class summary: {html.escape(the.assignment)}</h1>",
             f"<p>{len(totals)} graded submission(s).</p>",
             "<h2>Scores per student</h2>", totals.to_html(classes="students", float_format=lambda v: f"{v:g}"),
             "<h2>Scores per check</h2>", per_check.to_html(classes="checks", float_format=lambda v: f"{v:.2f}")]
    if not ups.empty:
        spread = ups.describe().T.rename(columns={"25%": "q1", "50%": "median", "75%": "q3"})
        parts += ["<h2>Measured speedups (cumulative, against each student's own baseline)</h2>",
                  "<h3>Distribution per rung across students</h3>",
                  spread[["count", "min", "q1", "median", "q3", "max"]].to_html(
                      classes="speedup-spread", float_format=lambda v: f"{v:.2f}", na_rep=""),
                  "<h3>Per student</h3>",
                  ups.to_html(classes="speedups", float_format=lambda v: f"{v:.2f}x", na_rep="")]
    distribution = scores.pivot_table(index=["notebook", "cell"], columns="score", values="student",
                                      aggfunc="nunique", fill_value=0)
    distribution.columns = [f"{c:g} points" for c in distribution.columns]
    parts += ["<h2>Distribution of each check's score (students per score)</h2>",
              distribution.to_html(classes="score-spread")]
    for name, fig in class_plots(scores, ups).items():
        parts.append(report.figure_html(fig, f"{name} plot"))
    out = Path(out) if out else the.root / "reports" / "class.html"
    return report.write_page(out, "PyTorch Performance Lab: class summary", parts)

