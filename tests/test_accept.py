"""``python -m autograder accept``: what it runs, what it tables, and when it says a class is ready."""

from __future__ import annotations

import json

import pytest

from autograder import accept


def _row(check, measured, status, *, better="higher", default=None, note="", device_class="cpu", reason=None,
         details=None):
    """A row as accept.checks_of writes it: one entry per run."""
    n = max(1, len(measured))
    reason = reason or {"pass": "pass", "n/a": "n/a", "fail": "below bar", "error": "error"}[status]
    return {"notebook": check[:2], "check": check, "measured": measured, "statuses": [status] * n,
            "reasons": [reason] * n, "notes": [note] * n, "seconds": [1.0] * n, "details": [details or {}] * n,
            "better": better, "class_default": default, "device_class": device_class}


def test_a_class_is_ready_only_when_the_reference_clears_every_check():
    ready = [_row("02-loader-speedup", [5.0, 5.5, 6.0], "pass", default=3.0),
             _row("02-data-wait-share", [0.05, 0.06, 0.05], "pass", better="lower", default=0.1),
             _row("03-amp-speedup", [None], "n/a", note="not on this class"),
             _row("04-grad-match", [1.0], "pass", default=1.0)]
    table = accept.checks_table(ready)
    assert accept.checks_ready(table) == []
    assert table.loc["02-loader-speedup", "measured"] == 5.5 and table.loc["02-loader-speedup", "spread"] == "5-6"
    assert table.loc["02-loader-speedup", "calibrated"] == 3.0  # 85% of the worst run is above the default

    # A slower machine: calibrate eases the bar to 85% of the worst run, which the reference clears.
    slow = accept.checks_table([_row("02-loader-speedup", [2.0, 2.2], "fail", default=3.0)])
    assert slow.loc["02-loader-speedup", "calibrated"] == 1.7 and accept.checks_ready(slow) == []
    # ... and says so: the bar is eased, and the reference misses the class default, set before the run.
    assert slow.loc["02-loader-speedup", "vs default"] == "misses"
    assert [e.split(":")[0] for e in accept.eased(slow)] == ["02-loader-speedup"]
    assert accept.eased(table) == [] and table.loc["02-loader-speedup", "vs default"] == "clears"
    assert table.loc["02-data-wait-share", "vs default"] == "clears"  # 0.05 <= 0.1 * 0.95, lower is better
    near = accept.checks_table([_row("02-loader-speedup", [3.05, 3.1], "pass", default=3.0)])
    assert near.loc["02-loader-speedup", "vs default"] == "within 5%"

    not_ready = accept.checks_table(ready + [
        _row("04-accum-match", [0.0], "fail", default=1.0, note="correctness check failed: gradients #0 differs",
             reason="incorrect"),
        _row("07 (the rest)", [], "error", note="stopped at its limit, 150 s"),
        _row("05-compile-speedup", [1.05, 1.06], "fail", default=1.25)])  # calibrated: n/a, said as such
    wrong = accept.checks_ready(not_ready)
    assert any(w.startswith("04-accum-match: the reference fails its correctness partner") for w in wrong), wrong
    assert any(w.startswith("07 (the rest): did not run (stopped at its limit") for w in wrong), wrong
    assert not_ready.loc["05-compile-speedup", "calibrated"] == "n/a"

    # 06's end-to-end without the ladder the checks part cannot have: excused, as calibrate excuses it;
    # any other partner of it is not.
    ladder = dict(note="correctness check failed: the ladder is incomplete", reason="incorrect", default=5.0)
    excused = accept.checks_table([_row("06-end-to-end", [40.0], "fail", **ladder,
                                        details={"only_the_ladder_incomplete": True})])
    assert accept.checks_ready(excused) == [] and excused.loc["06-end-to-end", "reason"] == "ladder excused"
    broken = accept.checks_table([_row("06-end-to-end", [40.0], "fail", **ladder,
                                       details={"only_the_ladder_incomplete": False})])
    assert "correctness partner" in accept.checks_ready(broken)[0]


def test_the_graded_reference_is_ready_on_its_automatic_points_and_cell_times(tmp_path):
    """As benchmark --grading tables it: 06's "8/8 (+4 by a person)" is full automatic marks (the
    form broke accept on its first run on class cpu-bf16); a lost point or a cell over half its
    limit is not."""
    import pandas as pd

    rows = [("06_report", "8/8 (+4 by a person)", 8.0, 8.0, 2.4, "setup"),
            ("04_checkpointing", "9/10", 9.0, 10.0, 13.0, "cell 22"),
            ("05_compile", "5/5", 5.0, 5.0, 400.0, "cell 5"),
            ("after the notebooks", "", None, None, None, "")]
    table = pd.DataFrame([dict(zip(("notebook", "score", "points", "automatic", "longest cell s", "longest cell"), r))
                          for r in rows]).set_index("notebook")
    wrong = accept.grade_ready(table, 600, tmp_path / "calibration.toml")
    assert len(wrong) == 2 and wrong[0].startswith("04_checkpointing: the reference scored 9/10"), wrong
    assert wrong[1].startswith("05_compile: its longest cell (cell 5) took 400 s"), wrong


def test_a_notebook_stopped_at_its_limit_is_reported_not_ready(tmp_path, tiny_env):
    """Each notebook's checks run in a process of their own, stopped at their limit and said so."""
    table = accept.run_checks(("07",), 1, tmp_path, limit_s=3)
    rows = json.loads((tmp_path / "checks.json").read_text())
    assert rows[-1]["check"].startswith("07 (") and "stopped at its limit" in rows[-1]["notes"][0], rows
    assert "did not run" in " ".join(accept.checks_ready(table))


def test_accept_tables_the_references_checks_against_the_class_defaults(tmp_path, tiny_env):
    report, wrong = accept.accept(("checks",), 1, ("01",), out=tmp_path, check_limit_s=300)
    text = report.read_text()
    assert wrong == [], text
    for check in ("01-throughput-error", "01-diagnose", "01-trace", "01-phases-labelled", "01-top-operators"):
        assert check in text  # 01's trace too: the check profiles labelled_step itself
    assert "This machine's class is ready." in text


def test_calibrate_excuses_only_06s_missing_ladder():
    """Read from the verdict file's row (the check's reason and details), not its note."""
    from autograder import calibrate
    from labsupport.grading import CheckResult, verdict_rows

    def result(reason, details=None, measured=40.0):
        found = CheckResult("06-end-to-end", measured, 5.0, "higher", "cpu", "fail" if reason != "pass" else "pass",
                            "correctness check failed: the ladder is incomplete", details or {}, reason)
        return verdict_rows({found.check: found})[found.check]

    assert calibrate._usable(result("incorrect", {"only_the_ladder_incomplete": True}))
    assert not calibrate._usable(result("incorrect", {"only_the_ladder_incomplete": False}))
    assert not calibrate._usable(result("incorrect"))
    assert calibrate._usable(result("below bar")) and calibrate._usable(result("pass"))
    assert not calibrate._usable(result("pass", measured=None))


# --- accept --budget: the first run on a new machine, bounded ---------------------------------------

@pytest.mark.parametrize("ignores", ["the part", "what it started"])
def test_a_bounded_part_is_stopped_at_its_share_with_everything_it_started(ignores, tmp_path, monkeypatch):
    """A part that outlives its share is sent SIGTERM, and its process group SIGKILL after the grace
    (or once the part exited): the part and the processes it started are gone when bounded
    returns, whichever of them ignored SIGTERM."""
    import sys
    import time

    from autograder import budget

    monkeypatch.setattr(budget, "STOP_GRACE_S", 1)
    pids = tmp_path / "pids"
    # A shell: it starts in milliseconds even on a loaded machine, so its trap is set well before
    # its share ends (a Python part could still be starting when SIGTERM came, and die of it).
    deaf = 'trap "" TERM; '
    stubborn = ((deaf if ignores == "the part" else "") + f"({deaf if ignores != 'the part' else ''}exec sleep 60) & "
                f"echo $$ $! > {pids}; wait")
    started = time.monotonic()
    said = budget.bounded(["sh", "-c", stubborn], 2, tmp_path / "part.log")
    assert said.startswith("stopped at its share of the budget") and time.monotonic() - started < 15, said
    def running(pid: int) -> bool:  # a zombie waiting for init to reap it runs nothing
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    for pid in map(int, pids.read_text().split()):
        deadline = time.monotonic() + 5  # SIGKILL is sent; the kernel ends the process soon after
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(pid), f"process {pid} of the stopped part is still running"
    assert budget.bounded([sys.executable, "-c", "pass"], 10, tmp_path / "ok.log") == ""
    assert budget.bounded([sys.executable, "-c", "raise SystemExit(3)"], 10, tmp_path / "bad.log").startswith("exit 3")
    assert budget.bounded([sys.executable, "-c", "pass"], 0.5, tmp_path / "late.log").startswith("not started")


def test_each_graded_check_is_read_against_its_class_default_with_the_margin(tmp_path):
    from autograder import budget

    csv = tmp_path / "grading-time.checks.csv"
    csv.write_text("student,notebook,cell,score,max_score,needs_manual_grade,check,measured,bar,result,reason,note\n"
                   "reference,02_data_loading,test_loader,4,4,False,02-loader-speedup | 02-data-wait-share,"
                   "3.1 | 0.02,>= 3 | <= 0.1,pass | pass,pass | pass,\n"
                   "reference,05_compile,test_compile,0,3,False,05-compile-speedup,1.1,>= 1.25,fail,below bar,\n"
                   "reference,01_profile,test_sync,2,2,False,01-throughput-sync,,,n/a,n/a,\n"
                   "reference,06_report,analysis,0,5,True,,,,,,\n"
                   "reference,07_compression,test_int8,0,2,False,07-int8-size,,,not graded,,\n")
    table = budget.checks_against_defaults(csv)  # a notebook not asked for ("not graded") is left out
    assert table.loc["02-loader-speedup", "vs default"] == "within 5%"
    assert table.loc["02-data-wait-share", "vs default"] == "clears"
    assert table.loc["05-compile-speedup", "vs default"] == "misses"
    assert table.loc["01-throughput-sync", "vs default"] == "" and len(table) == 4


@pytest.mark.long
def test_the_first_run_grades_then_runs_and_says_what_the_budget_did_not_reach(tmp_path, tiny_env):
    """At the tiny profile, 01 only, in 150 s: the reference graded through the judge and the
    sandbox against the class defaults, then the notebooks until the budget ends; accept.md lists
    each notebook as run or not reached, and the command says it did not reach them all."""
    from autograder import budget, course

    started = __import__("time").monotonic()
    report, wrong = budget.within_budget(150, ("01",), course.COURSE_ROOT, tmp_path / "first-run")
    took = __import__("time").monotonic() - started
    text = report.read_text()
    assert took < 150 + 2 * budget.STOP_GRACE_S + 30, took
    assert "## The reference graded as a student" in text and "## The reference notebooks in the time left" in text
    masters = [p.name for p in course.masters(course.COURSE_ROOT)]
    assert all(f"- {name}: " in text for name in masters), text
    if "01_profile" in text.split("## The reference notebooks")[0]:  # the graded part finished
        assert "01-throughput-error" in text and "10/10" in text.replace(".0", ""), text
    assert wrong and any("not reached" in text or "stopped" in w for w in wrong), wrong
