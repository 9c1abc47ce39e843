"""A check's bar is decided in one place, labsupport.grading.bar: the self-check and the judge
(grading.judge), the grader's recomputation (autograder/deciding.py), calibrate, benchmark and accept
all give the same bar, or the same n/a and reason, on a calibrated case, a class n/a and the tiny
profile; and no module of grading decides an n/a or reads the bars' files by itself."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from autograder import accept, benchmark, calibrate, deciding
from labsupport import grading, hardware

ROOT = Path(__file__).resolve().parent.parent
AMX = {"device_class": "cpu-bf16", "device_name": "Intel(R) Xeon(R) Processor", "profile": "cpu-bf16"}
PLAIN_CPU = {"device_class": "cpu", "device_name": "Some laptop", "profile": "cpu"}
CALIBRATION = ('[machine]\ndevice_class = "cpu-bf16"\ndevice_name = "Intel(R) Xeon(R) Processor"\n'
               '[calibration]\nprofile = "cpu-bf16"\n[thresholds]\n"03-amp-speedup" = 1.2\n')


def machine_of(facts: dict) -> hardware.Machine:
    return dataclasses.replace(hardware.describe_machine(torch.device("cpu")), **facts)


def lab_of(facts: dict, bars: grading.Bars, profile: str | None = None) -> grading.GradedLab:
    machine = machine_of(facts)
    return grading.GradedLab(torch.device("cpu"), machine, hardware.profile_for(profile or machine.profile, ""),
                             seed=0, bars=bars)


def decided(monkeypatch, tmp_path, facts, check, measured, status, profile=""):
    """The grader's decision on a verdict row, with the calibration and profile in the environment
    (as the grader's batch sets them)."""
    cal = tmp_path / "calibration.toml"
    cal.write_text(CALIBRATION)
    monkeypatch.setenv("LAB_CALIBRATION", str(cal))
    monkeypatch.setenv("LAB_PROFILE", profile)
    verdict = {"checks": {check: {"status": status, "reason": status, "measured": measured, "note": ""}}}
    return deciding.decide(verdict, [check], machine_of(facts))[check]


def test_a_calibrated_bar_is_the_same_everywhere(monkeypatch, tmp_path):
    cal = tmp_path / "calibration.toml"
    cal.write_text(CALIBRATION)
    bars = grading.Bars.read(calibration=cal)
    found = grading.bar("03-amp-speedup", AMX, None, bars)
    assert (found.threshold, found.source, found.calibrated) == (1.2, "calibration", True)
    # the self-check and the judge
    assert grading.judge("03-amp-speedup", 1.25, lab_of(AMX, bars)).status == "pass"
    assert grading.judge("03-amp-speedup", 1.15, lab_of(AMX, bars)).threshold == 1.2
    # the grader's recomputation
    assert decided(monkeypatch, tmp_path, AMX, "03-amp-speedup", 1.25, "pass").result == "pass"
    fell = decided(monkeypatch, tmp_path, AMX, "03-amp-speedup", 1.15, "pass")
    assert (fell.result, fell.reason, fell.bar) == ("fail", "below bar", ">= 1.2")
    # the class default under it: calibrate's, benchmark's and accept's
    default = grading.bar("03-amp-speedup", AMX, None, grading.Bars.read())
    assert default.threshold == 1.3 == calibrate.derive(
        "03-amp-speedup", grading.check_specs()["03-amp-speedup"], "cpu-bf16", [])[0]
    assert benchmark.table({"03-amp-speedup": [1.5]}, machine_of(AMX)).loc["03-amp-speedup", "class default"] == 1.3
    row = {"check": "03-amp-speedup", "measured": [1.5], "statuses": ["pass"], "reasons": ["pass"], "notes": [""],
           "seconds": [1.0], "better": "higher", "class_default": default.threshold, "device_class": "cpu-bf16"}
    shown = accept.checks_table([row]).loc["03-amp-speedup"]
    assert (shown["class default"], shown["clears it"]) == (1.3, "yes")


def test_a_class_na_is_the_same_everywhere(monkeypatch, tmp_path):
    bars = grading.Bars.read()
    found = grading.bar("03-amp-speedup", PLAIN_CPU, None, bars)
    assert found.threshold is None and found.source == "class" and "bf16" in found.why_na
    judged = grading.judge("03-amp-speedup", 1.0, lab_of(PLAIN_CPU, bars))
    assert (judged.status, judged.note) == ("n/a", found.why_na)
    assert decided(monkeypatch, tmp_path, PLAIN_CPU, "03-amp-speedup", 1.0, "pass").result == "n/a"
    spec = grading.check_specs()["03-amp-speedup"]
    assert calibrate.derive("03-amp-speedup", spec, "cpu", [2.0]) == ("n/a", found.why_na)
    assert benchmark.table({"03-amp-speedup": [1.0]}, machine_of(PLAIN_CPU)).loc["03-amp-speedup",
                                                                              "class default"] == "n/a"


def test_the_tiny_profile_makes_a_speed_check_na_in_the_bar(monkeypatch, tmp_path):
    """The tiny test profile grades no speed: the bar says so (thresholds.toml's ``scale``), with
    the reason, and the grader allows that n/a; the same check still fails when it is wrong."""
    bars = grading.Bars.read()
    found = grading.bar("02-loader-speedup", AMX, "tiny", bars)
    assert found.threshold is None and found.source == "profile" and "profile tiny" in found.why_na
    assert grading.bar("02-loader-speedup", AMX, "tiny:grades_speed=1", bars).threshold == 3.0
    lab = lab_of(AMX, bars, "tiny")
    assert grading.judge("02-loader-speedup", 9.0, lab).status == "n/a"
    assert grading.judge("02-loader-speedup", 9.0, lab, correct=False).reason == "incorrect"
    assert grading.judge("02-data-wait-share", 0.5, lab, note="a note").note == f"{found.why_na}; a note"
    assert decided(monkeypatch, tmp_path, AMX, "02-loader-speedup", 9.0, "n/a", "tiny").result == "n/a"
    # 02's second bar (thresholds.toml's fall), decided by judge where speed is graded
    real = lab_of(AMX, bars)
    assert grading.judge("02-data-wait-share", 0.05, real, fell=(4.0, 25.0)).status == "pass"
    fell = grading.judge("02-data-wait-share", 0.05, real, note="n", fell=(20.0, 25.0))
    assert (fell.status, fell.reason) == ("fail", "below bar") and fell.note.endswith("0.5x that or less; n")
    assert grading.judge("02-data-wait-share", 0.05, real, correct=False, fell=(20.0, 25.0)).reason == "incorrect"
    # 06's stage bar is the registry's rung count, on every class
    from labsupport import notebooks
    assert {grading.bar("06-stages", {"device_class": c}, None, bars).threshold
            for c in hardware.DEVICE_CLASSES} == {len(notebooks.rungs())}


def test_grading_decides_no_na_and_reads_no_bar_file_by_itself():
    """An n/a comes from the bar (through judge); the bars' files are named by the environment in
    bars.py's two path functions only, which the entry points call."""
    grading_dir = ROOT / "labsupport" / "grading"
    for path in sorted(grading_dir.glob("*.py")):
        text = path.read_text()
        assert not re.search(r'CheckResult\([^)]*"n/a"', text, re.S) or path.name in ("__init__.py", "bars.py"), (
            f"{path.name} makes an n/a CheckResult by hand: ask grading.bar (judge, lab_bar)")
        assert "grades_speed and correct" not in text and "not lab.profile.grades_speed" not in text, (
            f"{path.name} decides the tiny profile's n/a by hand: give the check a `scale` in thresholds.toml")
        if path.name != "bars.py":
            assert not re.search(r'environ\.get\("LAB_(THRESHOLDS|CALIBRATION)"', text), path.name
            assert ".defaults.get(" not in text and ".defaults[" not in text, path.name
    for name in ("accept.py", "benchmark.py", "calibrate.py"):
        text = (ROOT / "autograder" / name).read_text()
        assert ".defaults.get(" not in text and ".defaults[" not in text and ".applies(" not in text, (
            f"autograder/{name} reads a class default itself: ask grading.bar")


def test_a_lab_without_bars_is_refused_with_the_way_out():
    machine = machine_of(AMX)
    plain = hardware.Lab(torch.device("cpu"), machine, hardware.profile_for(machine.profile, ""), seed=0)
    with pytest.raises(grading.GradingSetupError, match="grading_lab"):
        grading.judge("03-amp-speedup", 1.5, plain)
