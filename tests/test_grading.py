"""The grading API: thresholds per class and calibration, verdicts with correctness partners,
a fresh labsupport that notebook monkeypatching cannot reach, and partners that catch wrong work."""

import pytest
import torch
from torch import nn

import labsupport
from labsupport import grading, hardware
from labsupport.train import StepConfig, TrainStep

AMX = {"device_class": "cpu-bf16", "device_name": "Intel(R) Xeon(R) Processor"}
PLAIN_CPU = {"device_class": "cpu", "device_name": "Some laptop"}


def lab_on(facts: dict, profile: str | None = None, bars: grading.Bars | None = None) -> grading.GradedLab:
    """A Lab on this CPU described as ``facts`` say, at ``profile`` (default: its class's), with
    ``bars`` (default: the files the environment names, read now, as ``grading_lab()`` reads them)."""
    import dataclasses

    machine = dataclasses.replace(hardware.describe_machine(torch.device("cpu")), profile=facts["device_class"],
                                  **facts)
    return grading.GradedLab(torch.device("cpu"), machine, hardware.profile_for(profile or machine.profile, ""),
                             seed=0, bars=bars or grading.Bars.from_environment())


def test_class_defaults_and_not_applicable():
    assert grading.threshold_for("03-amp-speedup", AMX) == (1.3, "higher", "")
    threshold, better, why = grading.threshold_for("03-amp-speedup", PLAIN_CPU)
    assert threshold is None and "no bf16 units" in why
    result = grading.judge("03-amp-speedup", 0.8, lab_on(PLAIN_CPU))
    assert result.status == "n/a" and result.passed and "no bf16 units" in result.note


def test_unknown_check_and_missing_file_are_clear(monkeypatch, tmp_path):
    with pytest.raises(grading.GradingSetupError, match="known checks"):
        grading.threshold_for("99-nothing", AMX)
    monkeypatch.setenv("LAB_THRESHOLDS", str(tmp_path / "none.toml"))
    with pytest.raises(grading.GradingSetupError, match="does not exist"):
        grading.threshold_for("03-amp-speedup", AMX)


def test_calibration_applies_only_to_its_machine(monkeypatch, tmp_path):
    cal = tmp_path / "calibration.toml"
    cal.write_text('[machine]\ndevice_class = "cpu-bf16"\ndevice_name = "Intel(R) Xeon(R) Processor"\n'
                   '[thresholds]\n"03-amp-speedup" = 1.5\n')
    monkeypatch.setenv("LAB_CALIBRATION", str(cal))
    assert grading.threshold_for("03-amp-speedup", AMX)[0] == 1.5
    other = {"device_class": "cpu-bf16", "device_name": "Another Xeon"}
    assert grading.threshold_for("03-amp-speedup", other)[0] == 1.3


def test_a_calibration_applies_only_at_the_profile_it_was_measured_at(monkeypatch, tmp_path):
    """A bar eased at the tiny test profile says nothing of the class's own scale: grading there,
    or at an edited profile, uses the class defaults. The profile is the one the check ran at (the
    Lab it was given), never read from the environment by the bar. (A memory ratio: the speed checks
    are n/a at the tiny profile, calibrated or not.)"""
    cal = tmp_path / "calibration.toml"
    cal.write_text('[machine]\ndevice_class = "cpu-bf16"\ndevice_name = "Intel(R) Xeon(R) Processor"\n'
                   '[calibration]\nprofile = "tiny"\n[thresholds]\n"03-activation-ratio" = 0.7\n')
    monkeypatch.setenv("LAB_CALIBRATION", str(cal))
    machine = {**AMX, "profile": "cpu-bf16"}
    assert grading.threshold_for("03-activation-ratio", machine, "tiny")[0] == 0.7
    assert grading.threshold_for("03-activation-ratio", machine)[0] == 0.6  # the machine's own profile
    assert grading.threshold_for("03-activation-ratio", machine, "tiny:rounds=5")[0] == 0.6
    monkeypatch.setenv("LAB_PROFILE", "tiny")
    assert grading.threshold_for("03-activation-ratio", machine, "cpu-bf16")[0] == 0.6
    assert grading.judge("03-activation-ratio", 0.65, lab_on(AMX, "tiny")).threshold == 0.7
    assert grading.judge("03-activation-ratio", 0.65, lab_on(AMX, "cpu-bf16")).threshold == 0.6


def test_a_calibration_measured_on_more_cores_does_not_apply_to_a_share_of_them(monkeypatch, tmp_path):
    """grade --jobs 2 on a 2-core machine grades each submission on one core: bars the reference
    cleared on both are not that core's, so the class defaults apply (calibrate on one share)."""
    cal = tmp_path / "calibration.toml"
    cal.write_text('[machine]\ndevice_class = "cpu-bf16"\ndevice_name = "Intel(R) Xeon(R) Processor"\n'
                   'cpu_cores = 2\n[thresholds]\n"03-amp-speedup" = 1.5\n')
    monkeypatch.setenv("LAB_CALIBRATION", str(cal))
    assert grading.threshold_for("03-amp-speedup", {**AMX, "cpu_cores": 2})[0] == 1.5
    assert grading.threshold_for("03-amp-speedup", {**AMX, "cpu_cores": 1})[0] == 1.3


@pytest.mark.parametrize("check, measured, status", [
    ("03-amp-speedup", 1.31, "pass"), ("03-amp-speedup", 1.29, "fail"),
    ("03-activation-ratio", 0.55, "pass"), ("03-activation-ratio", 0.65, "fail"),
    ("03-amp-speedup", None, "fail"),
])
def test_judge_compares_in_the_right_direction(check, measured, status):
    assert grading.judge(check, measured, lab_on(AMX)).status == status


def test_fast_but_wrong_fails():
    result = grading.judge("03-amp-speedup", 5.0, lab_on(AMX), correct=False, why_incorrect="NaN weights")
    assert result.status == "fail" and "NaN weights" in result.note and not result.passed


def test_not_applicable_still_needs_the_optimisation_done():
    """Where speed cannot be graded the points need the work seen directly (e.g. a compiled
    model); and a bar that unoptimised code clears on this machine earns nothing."""
    lazy = grading.judge("03-amp-speedup", 1.0, lab_on(PLAIN_CPU), optimised=False, why_not_optimised="no graph")
    assert lazy.status == "fail" and "not optimised: no graph" in lazy.note and not lazy.passed
    assert grading.judge("03-amp-speedup", 1.0, lab_on(PLAIN_CPU)).status == "n/a"
    assert grading.judge("02-data-wait-share", 0.07, lab_on(AMX), optimised=False).status == "fail"
    assert grading.judge("02-data-wait-share", 0.07, lab_on(AMX)).status == "pass"


def test_fresh_copy_ignores_monkeypatching(monkeypatch):
    monkeypatch.setattr(labsupport.measure, "compare", lambda *a, **k: "fake speedup")
    graded = grading.fresh()
    assert graded.measure.compare is not labsupport.measure.compare
    result = graded.measure.compare(lambda: None, lambda: None, "cpu", rounds=1, steps_per_round=1)
    assert result.speedup.n == 1


def test_table_shows_measured_threshold_and_result():
    rows = grading.table([grading.judge("03-amp-speedup", 1.7, lab_on(AMX)),
                          grading.judge("03-activation-ratio", 0.7, lab_on(AMX))])
    assert list(rows.columns) == ["check", "measured", "threshold", "result", "note"]
    assert list(rows["result"]) == ["PASS", "FAIL"] and rows["threshold"][0] == ">= 1.3"


def _batches(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g))
            for _ in range(n)]


def test_same_batches_catches_dropped_and_altered_batches():
    assert grading.same_batches(_batches(), _batches()) == (True, "")
    ok, why = grading.same_batches(_batches(), _batches()[:2])
    assert not ok and "ended at batch 2" in why
    altered = [(x + 0.01, y) for x, y in _batches()]
    ok, why = grading.same_batches(_batches(), altered)
    assert not ok and "pixel values differ" in why


def test_same_epoch_labels_catches_dropped_samples():
    labels = torch.arange(10).repeat(10)  # 100 samples
    assert grading.same_epoch_labels(labels, labels[torch.randperm(100)][:96], batch_size=8)[0]
    ok, why = grading.same_epoch_labels(labels, labels[:50], batch_size=8)
    assert not ok and "50 of 100" in why
    ok, why = grading.same_epoch_labels(labels, torch.cat([labels, labels[:5]]), batch_size=8)
    assert not ok and "more often" in why


def _small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 10))


def test_step_trains_accepts_a_real_step():
    x, y = _batches(1)[0]
    assert grading.step_trains(TrainStep(_small_net(), StepConfig(), "cpu"), x, y) == (True, "")


def test_step_trains_catches_a_step_that_skips_backward():
    class NoBackward(TrainStep):
        def __call__(self, images, labels, clock=None):
            with torch.no_grad():
                return nn.functional.cross_entropy(self.net(images), labels)

    x, y = _batches(1)[0]
    ok, why = grading.step_trains(NoBackward(_small_net(), StepConfig(), "cpu"), x, y)
    assert not ok and "did not change" in why


def test_step_trains_catches_fp16_without_a_scaler_writing_nan():
    x, y = _batches(1)[0]
    # Large inputs overflow fp16 activations and gradients; with no GradScaler to skip those
    # steps, SGD writes inf/NaN into the weights.
    def no_scaler(net, optimizer, scaler, images, labels, dtype):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype):
            loss = nn.functional.cross_entropy(net(images), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    def with_scaler(net, optimizer, scaler, images, labels, dtype):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype):
            loss = nn.functional.cross_entropy(net(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.detach()

    step = TrainStep(_small_net(), StepConfig(amp_dtype="float16", lr=10.0), "cpu", update=no_scaler)
    ok, why = grading.step_trains(step, x * 1e4, y)
    assert not ok and ("inf/NaN" in why or "non-finite loss" in why), why
    scaled = TrainStep(_small_net(), StepConfig(amp_dtype="float16"), "cpu", update=with_scaler)
    assert grading.step_trains(scaled, x * 1e2, y, steps=20) == (True, "")


def test_a_graded_function_that_patches_a_library_fails_and_cannot_change_the_timing(monkeypatch):
    """A student's function that replaces time.perf_counter (to shrink its measured time) or a
    function the naive baseline runs (to slow it) fails the check it was measured in, and the
    originals are back afterwards. labsupport's clock was bound at import, so the timing itself
    never used the fake one."""
    import time

    import PIL.Image

    from labsupport import measure

    real_clock, real_open = time.perf_counter, PIL.Image.open
    seen = {}

    def measured(namespace, lab):
        namespace["make_fast_loader"](lab)  # the student's code runs inside the check
        seen["one_off_s"] = measure.one_off_s(lambda: sum(range(10**6)), "cpu")
        return [grading.judge("02-loader-speedup", 5.0, lab)]

    def faking(lab):
        time.perf_counter = lambda: 0.0  # every interval measures 0 s
        PIL.Image.open = lambda *a, **k: time.sleep(0.01) or real_open(*a, **k)  # a slower baseline

    grading.run("02", {}, keep=False)  # registers 02's checks
    monkeypatch.setitem(grading._CHECKS, "02", [(("02-loader-speedup",), measured)])
    found = grading.run("02", {"make_fast_loader": faking}, keep=False)["02-loader-speedup"]
    assert found.status == "fail" and "time.perf_counter" in found.note and "PIL.Image.open" in found.note
    assert time.perf_counter is real_clock and PIL.Image.open is real_open
    assert seen["one_off_s"] > 0  # measured with the real clock, although the fake one was in place


SPAWNED_CHECKS = r'''
import multiprocessing as mp
import sys

if __name__ == "__main__":
    # What macOS and Windows do: DataLoader workers are new processes that unpickle what they run.
    mp.set_start_method("spawn", force=True)
    started = []  # how each worker process was started: multiprocessing's popen module
    real_start = mp.process.BaseProcess.start

    def start(self):
        real_start(self)
        started.append(type(self._popen).__module__.rsplit(".", 1)[-1])

    mp.process.BaseProcess.start = start
    from labsupport import grading

    fresh = grading.fresh()  # as a notebook's "Check your work" cell measures
    # Both splits, as 03's accuracy run decodes them at the real profile (a worker each: one
    # thread per process here); the images' count means the spawned workers delivered.
    decoded = [len(fresh.pipeline.decode_once(split, size=32, progress=False)[1]) for split in ("train", "val")]
    print(fresh.__name__, "started:", sorted(started), "decoded:", decoded)
'''


def test_checks_that_start_dataloader_workers_run_under_spawn(tmp_path, tiny_data):
    """decode_once's workers (03's accuracy run, 06's end to end, the reference loader) unpickle
    the dataset's loader function by the installed package's name, not by the private copy's
    (grading.fresh), which a spawned process cannot import."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    checkout = Path(__file__).resolve().parents[1]
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED_CHECKS)
    env = {**os.environ, "LAB_DATA": str(tiny_data), "LAB_PROFILE": "tiny", "LAB_RESULTS": str(tmp_path / "results"),
           "PYTHONPATH": str(checkout)}
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "_labsupport_graded_" in run.stdout and "started: ['popen_spawn_posix', 'popen_spawn_posix']" in run.stdout \
        and "decoded: [40, 20]" in run.stdout, run.stdout


def test_a_notebook_graded_in_two_calls_keeps_both_with_their_reasons(monkeypatch, tmp_path):
    """03 grades its accuracy where it is taught and the rest at the end: the kept table (the
    report's, and what make run reads the reasons from) holds both calls' checks, in the
    notebook's order, the later call replacing only what it measured again."""
    import json

    monkeypatch.setenv("LAB_RESULTS", str(tmp_path))

    def result(check, status, reason):
        return grading.CheckResult(check, 1.0, 2.0, "higher", "cpu", status, "", {}, reason)

    grading.keep_checks("03", [result("03-accuracy-gap", "fail", "incorrect")])
    grading.keep_checks("03", [result("03-fp16-scaler", "pass", "pass"), result("03-amp-speedup", "fail", "below bar")])
    grading.keep_checks("03", [result("03-accuracy-gap", "pass", "pass")])
    rows = json.loads((tmp_path / "checks" / "03.json").read_text())
    assert [(r["check"], r["result"], r["reason"]) for r in rows] == [
        ("03-amp-speedup", "FAIL", "below bar"), ("03-accuracy-gap", "PASS", "pass"), ("03-fp16-scaler", "PASS", "pass")]
    assert list(grading.kept_checks(tmp_path).check) == ["03-amp-speedup", "03-accuracy-gap", "03-fp16-scaler"]
