"""``python -m autograder accept``: what it runs, what it tables, and when it says a class is ready."""

from __future__ import annotations

import json

from autograder import accept


def _row(check, measured, status, *, better="higher", default=None, note="", device_class="cpu"):
    return {"notebook": check[:2], "check": check, "measured": measured, "statuses": [status] * max(1, len(measured)),
            "notes": [note] * max(1, len(measured)), "seconds": [1.0] * max(1, len(measured)), "better": better,
            "class_default": default, "device_class": device_class}


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

    not_ready = accept.checks_table(ready + [
        _row("04-accum-match", [0.0], "fail", default=1.0, note="correctness check failed: gradients #0 differs"),
        _row("07 (the rest)", [], "error", note="stopped at its limit, 150 s"),
        _row("05-compile-speedup", [1.05, 1.06], "fail", default=1.25)])  # calibrated: n/a, said as such
    wrong = accept.checks_ready(not_ready)
    assert any(w.startswith("04-accum-match: the reference fails its correctness partner") for w in wrong), wrong
    assert any(w.startswith("07 (the rest): did not run (stopped at its limit") for w in wrong), wrong
    assert not_ready.loc["05-compile-speedup", "calibrated"] == "n/a"


def test_a_notebook_stopped_at_its_limit_is_reported_not_ready(tmp_path, tiny_data, monkeypatch):
    """Each notebook's checks run in a process of their own, stopped at their limit and said so."""
    monkeypatch.setenv("LAB_PROFILE", "tiny")
    monkeypatch.setenv("LAB_DATA", str(tiny_data))
    table = accept.run_checks(("07",), 1, tmp_path, limit_s=3)
    rows = json.loads((tmp_path / "checks.json").read_text())
    assert rows[-1]["check"].startswith("07 (") and "stopped at its limit" in rows[-1]["notes"][0], rows
    assert "did not run" in " ".join(accept.checks_ready(table))


def test_accept_tables_the_references_checks_against_the_class_defaults(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setenv("LAB_PROFILE", "tiny")
    monkeypatch.setenv("LAB_DATA", str(tiny_data))
    report, wrong = accept.accept(("checks",), 1, ("01",), out=tmp_path, check_limit_s=300)
    text = report.read_text()
    assert wrong == [], text
    for check in ("01-throughput-error", "01-diagnose", "01-top-operators"):
        assert check in text
    assert "01-trace" not in text  # read from the notebook's own run: the grade part's
    assert "This machine's class is ready." in text
