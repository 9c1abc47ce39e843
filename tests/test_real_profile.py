"""What the tiny profile cannot show: a cheat graded at this machine's own profile.

The instructor tests (tests/test_instructor.py) grade every scenario at the tiny profile, which
grades no speed. What the ``hardcoded`` scenario's code gains or loses on speed is proven here,
with the grader's checks at the real profile, on the real dataset. A file of its own, so that
``make test`` (a test file per core at once) runs it beside the instructor tests.
"""

from __future__ import annotations

import pytest

import scenarios
from labsupport import grading
from labsupport.hardware import describe_machine


@pytest.mark.slow
@pytest.mark.long
def test_hardcoded_answers_fail_the_speed_checks_at_the_real_profile(monkeypatch, tmp_path):
    """At this machine's own profile, on the real dataset: the hardcoded scenario's code fails every
    speed check that applies on this device class, while its correctness partners pass.

    The grading machine is calibrated as one where compiling does not pay (05's speed n/a, as
    `calibrate` writes on an AVX-512 BF16 CPU without AMX): the uncompiled model still fails. And
    the naive loader, whose data wait is under the 10% bar on a CPU, fails the data-wait check.
    """
    monkeypatch.delenv("LAB_PROFILE", raising=False)
    monkeypatch.delenv("LAB_DATA", raising=False)
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    machine = describe_machine().as_dict()
    calibration = tmp_path / "calibration.toml"
    calibration.write_text(f'[machine]\ndevice_class = "{machine["device_class"]}"\n'
                           f'device_name = "{machine["device_name"]}"\n'
                           '[thresholds]\n"05-compile-speedup" = "n/a"\n')
    monkeypatch.setenv("LAB_CALIBRATION", str(calibration))
    from autograder import reference

    reference.keep_all()  # 05 infers in 03's precision: the reference's, carried forward
    cheat = {name[:2]: nb for name, nb in scenarios.from_checkout("hardcoded").items()}
    speed = {"02": ("02-loader-speedup", "02-data-wait-share"), "03": ("03-amp-speedup",),
             "05": ("05-compile-speedup",)}
    for notebook, ids in speed.items():
        if notebook == "03" and grading.threshold_for("03-amp-speedup", machine)[0] is None:
            print(f"03-amp-speedup not graded on {machine['device_class']}, where fp32 is the lab's choice")
            continue
        namespace = reference.execute(cheat[notebook], notebook, f"hardcoded {notebook}")  # the cheat's graded cells
        found = grading.run(notebook, namespace, only=ids, keep=False)
        for check in ids:
            result = found[check]
            assert result.status == "fail" and not result.note.startswith("correctness"), (check, result)
