"""``accept --budget S``: the first run on a new machine (a rented GPU) in one bounded command.

An instructor's first try of the lab on a GPU, like ours, is one run of about ten minutes (issue 58).
Within ``S`` seconds, in order:

1. **the reference graded as a student**, through the judge and the sandbox (``benchmark --grading``
   in a child process), against the **class defaults** (no calibration: calibrate runs the checks
   several times, which a first run has no time for): its score per notebook and its time, and
   each check's measurement against its class default with the margin (:func:`accept.versus_default`);
2. **the reference notebooks** (``run``, as ``make run``) in the time left, each one's time and peak.

Each part is a child process in a session of its own, stopped at its share of the budget with
SIGTERM, which ``grade`` and ``run`` handle by ending every kernel, sandbox and worker they
started (then SIGKILL, 30 s later). ``accept.md`` says what each part reached and names what it
did not; the command exits non-zero where anything was not reached, or lost a point.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from . import calibrate, course
from .accept import versus_default
from .benchmark import checks_path

GRADE_SHARE = 0.6  # of the budget, for the graded reference; the notebooks run in the rest
STOP_GRACE_S = 30  # after SIGTERM, before SIGKILL
RAN = re.compile(r"^ran (\S+\.ipynb) in (\d+) s, peak (\S+) GiB")  # run's line per notebook it finished


def bounded(cmd: list[str], seconds: float, log: Path, env: dict[str, str] | None = None) -> str:
    """Run ``cmd`` in a session of its own, its output to ``log``, for ``seconds`` at most; then
    SIGTERM to its process group, and SIGKILL :data:`STOP_GRACE_S` later. Returns "" when it exited
    0, else what happened (also when this process is stopped: the child is stopped first)."""
    if seconds < 1:
        return "not started: no time left in the budget"
    with open(log, "w") as out:
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, **(env or {})})
        try:
            code = child.wait(timeout=seconds)
            return "" if code == 0 else f"exit {code} (its output: {log})"
        except subprocess.TimeoutExpired:
            _stop(child)
            return f"stopped at its share of the budget, {seconds:.0f} s"
        except BaseException:
            _stop(child)
            raise


def _stop(child: subprocess.Popen) -> None:
    """SIGTERM to ``child``'s process group; after :data:`STOP_GRACE_S` (or once it exited), SIGKILL
    to whatever of the group is left, a process that ignored SIGTERM or outlived its parent."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def checks_against_defaults(by_check: Path) -> pd.DataFrame:
    """Each graded check of the graded reference (``grades_by_check.csv``'s rows, a check per
    row): its measurement, its bar (the class default: nothing was calibrated), the result, and
    how it compares with the bar, margin included (:func:`accept.versus_default`)."""
    if not by_check.is_file():
        return pd.DataFrame()
    rows = []
    for _, cell in pd.read_csv(by_check, dtype=str, keep_default_na=False).iterrows():
        parts = {k: str(cell.get(k, "")).split(" | ") for k in ("check", "measured", "bar", "result")}
        for check, measured, bar, result in zip(*parts.values()):
            if not check or result == "not graded":  # a notebook not asked for
                continue
            value = float(measured) if measured not in ("", "None") else None
            op, _, number = bar.partition(" ")
            better = "lower" if op.startswith("<") else "higher"
            limit = float(number) if number else None
            rows.append({"notebook": cell["notebook"], "check": check, "measured": value, "bar": bar,
                         "result": result, "vs default": versus_default(value, limit, better)})
    return pd.DataFrame(rows).set_index("check") if rows else pd.DataFrame()


def within_budget(budget_s: float, numbers: tuple[str, ...], where: course.Course | Path,
                  out: Path) -> tuple[Path, list[str]]:
    """The graded reference, then the reference notebooks, within ``budget_s``; writes
    ``out/accept.md``. Returns its path and what was not reached or was lost."""
    from labsupport.hardware import describe_machine

    began = time.monotonic()
    root = course.of(where).root
    machine = describe_machine()
    out.mkdir(parents=True, exist_ok=True)
    autograder = [sys.executable, "-m", "autograder", "--course", str(root)]
    wrong: list[str] = []
    sections = [f"# First run on {machine.cpu_model if machine.device == 'cpu' else machine.device_name}, "
                f"{dt.datetime.now().isoformat(timespec='minutes')}\n\nClass {machine.device_class}, "
                f"{machine.cpu_cores} cores, torch {machine.torch_version}; a budget of {budget_s:.0f} s "
                f"({GRADE_SHARE:.0%} for the graded reference, the rest for the notebooks).\n"]

    # 1. The reference graded as a student, against the class defaults.
    timing = out / "grading-time.txt"
    for stale in (timing, checks_path(timing)):
        stale.unlink(missing_ok=True)
    trouble = bounded([*autograder, "benchmark", "--grading", "--output", str(timing), *numbers],
                      GRADE_SHARE * budget_s, out / "grade.log",
                      env={"LAB_CALIBRATION": str(out / "no-calibration.toml")})
    sections.append("\n## The reference graded as a student (class defaults, no calibration)\n\n"
                    + (timing.read_text() if timing.is_file() else "Not finished: nothing graded to show.\n"))
    checks = checks_against_defaults(checks_path(timing))
    if not checks.empty:
        sections.append("\n### Each check against its class default\n\n"
                        + checks.to_string(float_format=lambda v: f"{v:.3g}") + "\n")
        wrong += [f"{check}: {row['result']} ({row['measured']} against {row['bar']})"
                  for check, row in checks.iterrows() if row["result"] not in ("pass", "n/a")]
        # The margin is for the measured bars (speed, memory: those calibrate sets), not for a
        # correctness count whose bar is its best (every case of 01's diagnose right).
        scaled = calibrate.calibrated_checks()
        wrong += [f"{check}: the reference clears its class default {row['bar']} by less than 5% "
                  f"({row['measured']:.3g})" for check, row in checks.iterrows()
                  if row["vs default"] == "within 5%" and check in scaled]
    if trouble:
        wrong.append(f"the graded reference: {trouble}")

    # 2. The reference notebooks, in the time left.
    left = budget_s - (time.monotonic() - began)
    trouble = bounded([*autograder, "run", "--build", str(out / "run-build")], left, out / "run.log")
    ran = [RAN.match(line).groups() for line in (out / "run.log").read_text().splitlines() if RAN.match(line)] \
        if (out / "run.log").is_file() else []
    masters = [p.name for p in course.masters(root)]
    sections.append(f"\n## The reference notebooks in the time left ({max(left, 0):.0f} s)\n\n"
                    + "".join(f"- {name}: {s} s, peak {peak} GiB\n" for name, s, peak in ran)
                    + "".join(f"- {name}: not reached\n" for name in masters[len(ran):]))
    if trouble:
        wrong.append(f"the reference notebooks: {trouble}; ran {len(ran)} of {len(masters)}")
    verdict = ("**Everything ran within the budget, at full marks.**" if not wrong else
               "**Not reached, or lost:**\n" + "\n".join(f"- {w}" for w in wrong))
    report = out / "accept.md"
    report.write_text("".join(sections) + f"\n## Verdict ({time.monotonic() - began:.0f} s)\n\n" + verdict + "\n")
    return report, wrong
