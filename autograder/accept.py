"""``accept``: is this machine's class ready to grade? What an instructor runs once on a new kind
of machine (their first GPU), and what we run when one is lent to us.

Its parts, each written as it finishes to ``build/accept-<device class>/`` and summed up in
``accept.md`` there, ending with the verdict "this machine's class is ready" or what failed:

1. **checks**: every graded check of every notebook, run on the reference solutions as a
   notebook's self-check runs them (in one process, the reference's code carried forward in a
   scratch results store), each notebook in its own process with a time limit, and the rows of
   each group of checks kept as it finishes. Each check's measurement against its class default,
   and, for the calibrated checks, the bar :func:`autograder.calibrate.derive` would give it,
   with the seconds its checks took. The checks that read what a notebook's own run wrote (06's
   ladder and HTML) are left to the next part.
2. **grade**: ``calibrate`` on this machine (into the output folder, not the course's file; it
   measures through the judges, as grading does, so its bars can differ from part 1's), then
   the reference submission graded with those bars as a student's is (``grade`` in a scratch copy
   of the course, :func:`autograder.benchmark.grading_time`): its score per notebook against the
   maximum, its time per notebook, and its longest cell against the class's cell limit.

The machine is ready when every check ran, the reference passes every one on the calibrated bars,
gets full marks when graded, and no cell of it takes more than half its limit. Not built: grading
the test scenarios (tests/scenarios/) here, since their expected scores are written for the tiny
profile, where no speed is graded.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from . import calibrate, course
from .course import COURSE_ROOT, REPO_ROOT

# Checks that read what a notebook's own run wrote (06's ladder of 01-05 and its exported HTML):
# the checks part has no notebook run, so they are graded in the grade part.
MADE_BY_THE_NOTEBOOK = ("06-stages", "06-html")

# A graded cell that takes more than this share of its limit on the reference is "too close":
# a slower student, or a busier machine, would lose it.
CELL_HEADROOM = 0.5


def checks_of(number: str, runs: int = 1, where: course.Course | Path = COURSE_ROOT,
              json_out: Path | None = None) -> list[dict]:
    """Every graded check of notebook ``number``, run ``runs`` times on the reference solutions in
    this process, against the class defaults: one dict per check (the fields of its CheckResult,
    every run's measurement, the seconds its group of checks took per run). With ``json_out``, the
    rows so far are written there after each group of checks, so a notebook stopped at its time
    limit still reports the checks it finished."""
    from labsupport import grading, measure
    from labsupport.hardware import describe_machine

    from . import reference

    measure.steady_heap()  # as a notebook's self-check measures, after ls.setup()
    the = course.of(where)
    machine = describe_machine().as_dict()
    defaults = grading.Bars.read(grading.thresholds_path())  # the class defaults: no calibration
    found: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="lab-accept-") as scratch, \
            course.environment({"LAB_RESULTS": scratch, "LAB_CALIBRATION": str(Path(scratch) / "none.toml")}):
        reference.keep_all(course_root=the.root)
        for _ in range(runs):
            fresh = grading.fresh().grading
            groups = [ids for ids in fresh.check_groups(number) if not set(ids) <= set(MADE_BY_THE_NOTEBOOK)]
            namespace = reference.namespace(number, the.root)
            for ids in groups:
                started = time.perf_counter()
                results = fresh.run(number, namespace, only=ids, keep=False, skip=MADE_BY_THE_NOTEBOOK)
                took = time.perf_counter() - started
                for check, result in results.items():
                    row = found.setdefault(check, {"notebook": number, "check": check, "measured": [], "statuses": [],
                                                   "reasons": [], "notes": [], "seconds": [], "details": []})
                    row["measured"].append(None if result.measured is None else float(result.measured))
                    row["statuses"].append(result.status)
                    row["reasons"].append(result.reason)
                    row["notes"].append(result.note)
                    row["seconds"].append(round(took, 1))
                    row["details"].append(json.loads(json.dumps(result.details, default=str)))
                    row.update(better=result.better, class_default=grading.bar(check, machine, None, defaults).threshold,
                               device_class=machine["device_class"])
                if json_out is not None:  # whole or not at all: the process may be stopped at any moment
                    partial = json_out.with_name(json_out.name + ".partial")
                    partial.write_text(json.dumps(list(found.values())))
                    partial.replace(json_out)
    return list(found.values())


def run_checks(numbers: tuple[str, ...], runs: int, out: Path, limit_s: float,
               where: course.Course | Path = COURSE_ROOT, deadline_s: float | None = None) -> pd.DataFrame:
    """:func:`checks_of` for each notebook in its own process, ``limit_s`` seconds at most each, and
    each ended by ``deadline_s`` seconds; the rows so far are written to ``out/checks.json``
    after every notebook. Returns the table."""
    root = course.of(where).root
    rows: list[dict] = []
    began = time.perf_counter()
    for number in numbers:
        started = time.perf_counter()
        if deadline_s is not None and started - began > deadline_s:
            rows.append({"notebook": number, "check": f"{number} (every check)", "measured": [],
                         "statuses": ["error"], "notes": [f"not started: past the {deadline_s:.0f} s deadline"],
                         "seconds": [0.0]})
            continue
        limit = limit_s if deadline_s is None else max(1.0, min(limit_s, deadline_s - (started - began)))
        with tempfile.NamedTemporaryFile(suffix=".json") as answer:
            cmd = [sys.executable, "-m", "autograder", "--course", str(root), "accept", "--checks-of",
                   number, "--runs", str(runs), "--json", answer.name]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
                trouble = "" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()[-600:]}"
            except subprocess.TimeoutExpired:
                trouble = f"stopped at its limit, {limit:.0f} s: the checks not listed did not finish"
            got = json.loads(Path(answer.name).read_text() or "[]")  # what finished, even when stopped
            Path(answer.name + ".partial").unlink(missing_ok=True)  # a write the stop cut short
        took = time.perf_counter() - started
        if trouble:
            rows.append({"notebook": number, "check": f"{number} ({'the rest' if got else 'every check'})",
                         "measured": [], "statuses": ["error"], "notes": [trouble], "seconds": [round(took, 1)]})
        rows += got
        print(f"accept: notebook {number}'s checks, {took:.0f} s" + (f": {trouble}" if trouble else ""), flush=True)
        (out / "checks.json").write_text(json.dumps(rows, indent=1))
    return checks_table(rows)


# The margin the reference must clear each class default by (issue 63): a bar it only just clears
# fails a perfect student's self-check on a slower machine of the same class.
DEFAULT_MARGIN = 0.05


def versus_default(median: float | None, bar, better: str | None) -> str:
    """How the reference's median compares with a class default set before this run: "clears" (by
    at least :data:`DEFAULT_MARGIN`), "within 5%" (clears it, by less), "misses", or "" (no bar)."""
    from labsupport import grading

    if median is None or not isinstance(bar, (int, float)) or isinstance(bar, bool):
        return ""
    better = better or "higher"
    if not grading.passes(median, bar, better):
        return "misses"
    with_margin = bar * (1 + DEFAULT_MARGIN) if better == "higher" else bar * (1 - DEFAULT_MARGIN)
    return "clears" if grading.passes(median, with_margin, better) else "within 5%"


def eased(table: pd.DataFrame) -> list[str]:
    """The checks whose bar calibrate derived here is easier than the class default: what this
    machine's students are graded against is lower than what the class promises. Each is named
    in accept.md (a machine can be ready with eased bars; nobody should learn it by surprise)."""
    out = []
    for check, row in table.iterrows():
        bar, calibrated = row["class default"], row["calibrated"]
        if not isinstance(bar, (int, float)) or not isinstance(calibrated, (int, float)) or calibrated == bar:
            continue
        easier = calibrated < bar if row.get("better", "higher") == "higher" else calibrated > bar
        if easier:
            out.append(f"{check}: calibrated to {calibrated:.3g}, easier than the class default {bar:.3g} "
                       f"(the reference measured {row['measured']:.3g} here)")
    return out


def checks_table(rows: list[dict]) -> pd.DataFrame:
    """One row per check: the median measurement, its class default and how it compares with it
    (:func:`versus_default`, a bar set before the run), and for a calibrated check the bar
    calibrate derives here from these runs and whether it clears that."""
    from labsupport import grading

    specs = calibrate.calibrated_checks()
    table = []
    for row in rows:
        values = [v for v in row["measured"] if v is not None]
        median = statistics.median(values) if values else None
        statuses = set(row["statuses"])
        status = statuses.pop() if len(statuses) == 1 else "/".join(sorted(row["statuses"]))
        bar = row.get("class_default")
        calibrated = ""
        if row["check"] in specs and status != "n/a":
            ok_runs = [v for v, s in zip(row["measured"], row["statuses"]) if v is not None and s != "error"]
            calibrated, _ = calibrate.derive(row["check"], specs[row["check"]], row.get("device_class", ""), ok_runs)
        clears = "" if median is None or calibrated in ("", "n/a") else \
            ("yes" if grading.passes(median, calibrated, row.get("better")) else "no")
        # The reasons of grading.REASONS; 06's end-to-end partner excused where only its ladder is
        # missing (the checks part runs no notebook), as calibrate excuses it.
        reasons = set(row.get("reasons", []))
        if reasons == {"incorrect"} and all(d.get("only_the_ladder_incomplete") for d in row.get("details") or [{}]):
            reasons = {"ladder excused"}
        table.append({"check": row["check"], "measured": median,
                      "spread": f"{min(values):.3g}-{max(values):.3g}" if len(values) > 1 else "",
                      "class default": bar if bar is not None else "n/a", "at default": status,
                      "vs default": versus_default(median, bar, row.get("better")), "better": row.get("better") or "higher",
                      "reason": "/".join(sorted(reasons)), "calibrated": calibrated, "clears it": clears,
                      "s": statistics.median(row["seconds"]) if row["seconds"] else None,
                      "note": "; ".join(sorted({n for n in row["notes"] if n}))[:160]})
    return pd.DataFrame(table).set_index("check") if table else pd.DataFrame()


def checks_ready(table: pd.DataFrame) -> list[str]:
    """What the checks part found wrong: a check that errored or did not run, a reference that fails
    a check's correctness partner or an uncalibrated check, or a calibrated bar it does not clear.
    06's end-to-end partner is excused for the ladder it cannot have here (as calibrate excuses it),
    read from the checks' reasons (``grading.REASONS``), not their notes."""
    wrong = []
    for check, row in table.iterrows():
        status, note, reasons = str(row["at default"]), str(row["note"]), str(row["reason"]).split("/")
        if "error" in status.split("/"):
            wrong.append(f"{check}: did not run ({note})")
        elif "incorrect" in reasons:
            wrong.append(f"{check}: the reference fails its correctness partner ({note})")
        elif "fail" in status.split("/") and row["calibrated"] == "":
            wrong.append(f"{check}: the reference fails it ({note})")
        elif row["clears it"] == "no":
            wrong.append(f"{check}: the reference measured {row['measured']:.3g}, calibrated bar {row['calibrated']}")
    return wrong


def grade_reference(numbers: tuple[str, ...], runs: int, out: Path,
                    where: course.Course | Path = COURSE_ROOT) -> tuple[pd.DataFrame, list[str]]:
    """``calibrate`` (into ``out/calibration.toml``), then the reference submission graded with it in
    a scratch course: each notebook's score against its maximum, its time, and its longest cell
    against the class's cell limit. Returns the table and what is wrong."""
    from labsupport.hardware import CLASSES, describe_machine

    from . import benchmark

    the = course.of(where)
    limit = CLASSES[describe_machine().device_class].cell_timeout_s
    calibration = out / "calibration.toml"
    calibrate.calibrate(runs, the, calibration, progress=False)
    with course.environment({"LAB_CALIBRATION": str(calibration)}):
        _, table = benchmark.grading_time(numbers, the, out / "grading-time.txt")
    table["cell limit s"] = [limit if isinstance(s, str) and s else None for s in table["score"]]
    return table, grade_ready(table, limit, calibration)


def grade_ready(table: pd.DataFrame, limit: float, calibration: Path) -> list[str]:
    """What the graded reference (:func:`autograder.benchmark.grading_time`'s table) shows wrong:
    an automatic point lost on the calibrated bars (06's analysis, a person's, is not counted), or a
    cell over :data:`CELL_HEADROOM` of the cell limit ``limit``."""
    wrong = []
    for notebook, row in table.iterrows():
        if not row["score"]:
            continue
        if row["points"] < row["automatic"]:
            wrong.append(f"{notebook}: the reference scored {row['score']} (calibrated bars, {calibration})")
        cell = row["longest cell s"]
        if cell is not None and cell == cell and cell > CELL_HEADROOM * limit:
            wrong.append(f"{notebook}: its longest cell ({row['longest cell']}) took {cell:.0f} s, over "
                         f"{CELL_HEADROOM:.0%} of the {limit} s cell limit")
    return wrong


def main_checks_of(number: str, runs: int, where: course.Course | Path, json_out: Path) -> int:
    """The child process of :func:`run_checks`."""
    checks_of(number, runs, where, json_out)
    return 0


def accept(parts: tuple[str, ...] = ("checks", "grade"), runs: int = 3,
           notebooks: tuple[str, ...] | None = None, where: course.Course | Path = COURSE_ROOT,
           out: Path | None = None, check_limit_s: float = 1800,
           deadline_s: float | None = None) -> tuple[Path, list[str]]:
    """Run the acceptance ``parts`` on this machine; returns ``accept.md``'s path and what failed."""
    unknown = set(parts) - {"checks", "grade"}
    if unknown:
        raise course.CourseError(f"accept has no part {', '.join(sorted(unknown))}: its parts are checks and grade.")
    from labsupport import notebooks as registry
    from labsupport.hardware import describe_machine, profile_for

    the = course.of(where)
    machine = describe_machine()
    out = Path(out) if out else REPO_ROOT / "build" / f"accept-{machine.device_class}"
    out.mkdir(parents=True, exist_ok=True)
    graded = [nb.number for nb in registry.NOTEBOOKS if nb.graded]
    numbers = tuple(n for n in (notebooks or graded) if n in graded)  # in the order asked for
    head = (f"# Acceptance on {machine.cpu_model if machine.device == 'cpu' else machine.device_name}, "
            f"{dt.datetime.now().isoformat(timespec='minutes')}\n\nClass {machine.device_class}, profile "
            f"{profile_for(machine.profile).name}, {machine.cpu_cores} cores, torch {machine.torch_version}, "
            f"parts: {', '.join(parts)}.\n")
    sections, wrong = [head], []
    if "checks" in parts:
        table = run_checks(numbers, runs, out, check_limit_s, the, deadline_s)
        sections.append(f"\n## The reference's checks ({runs} run{'s' * (runs > 1)})\n\n"
                        + table.to_string(float_format=lambda v: f"{v:.3g}") + "\n")
        wrong += checks_ready(table)
        flagged = eased(table)
        sections.append("\n### Bars calibration eased on this machine\n\n"
                        + ("\n".join(f"- {e}" for e in flagged) if flagged else "None.") + "\n")
        scaled = calibrate.calibrated_checks()  # a correctness count's bar is its best: no margin to keep
        short = [f"{check}: {row['vs default']} ({row['measured']:.3g} against {row['class default']})"
                 for check, row in table.iterrows()
                 if row["vs default"] == "misses" or (row["vs default"] == "within 5%" and check in scaled)]
        sections.append("\n### Class defaults the reference does not clear by 5%\n\n"
                        + ("\n".join(f"- {s}" for s in short) if short else "None.") + "\n")
    if "grade" in parts:
        table, problems = grade_reference(numbers, runs, out, the)
        sections.append(f"\n## The reference graded as a student ({runs} calibration run{'s' * (runs > 1)})\n\n"
                        + table.to_string(float_format=lambda v: f"{v:.1f}") + "\n")
        wrong += problems
    verdict = ("**This machine's class is ready.**" if not wrong else
               "**Not ready:**\n" + "\n".join(f"- {w}" for w in wrong))
    report = out / "accept.md"
    report.write_text("".join(sections) + "\n## Verdict\n\n" + verdict + "\n")
    return report, wrong
