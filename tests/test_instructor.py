"""The instructor pipeline proven end to end, in the manner of nbgrader's own tests: scenario
submissions (tests/scenarios/, built by tests/scenarios.py) are collected from an inbox, graded in a temporary course and
checked for their exact scores per notebook, feedback files, summary and reports.

The scenarios run on the tiny profile and dataset to keep CI fast. The tiny profile grades no
speed (those checks say n/a after the student's code ran, and n/a earns the points), so what a
cheat gains or loses on speed is proven at the real profile in tests/test_real_profile.py
(``test_hardcoded_answers_fail_the_speed_checks_at_the_real_profile``).
"""

from __future__ import annotations

import hashlib
import os
import sys
import shutil
import subprocess
import tomllib
import zipfile
from pathlib import Path

import nbformat
import pandas as pd
import pytest

import scenarios
from autograder import (calibrate, collect, course, deciding, grade, gradebook, parallel, release, reports, sandbox,
                        sandbox_disk, sandbox_users, tasks)
from labsupport import grading
from labsupport.hardware import describe_machine

POINTS = {  # grade id -> points, read from the masters (asserted against them below)
    "01_profile": {"test_throughput": 3, "test_throughput_sync": 1, "test_diagnose": 2, "test_trace": 1,
                   "test_phases_labelled": 1, "test_top_operators": 2},
    "02_data_loading": {"test_loader_speedup": 3, "test_data_wait": 2},
    "03_amp": {"test_accuracy": 2, "test_amp_speedup": 3, "test_activation_memory": 2, "test_fp16_scaler": 2},
    "04_checkpointing": {"test_grad_match": 2, "test_activation_ratio": 2, "test_peak_ratio": 1,
                         "test_fits_budget": 2, "test_time_overhead": 1, "test_accumulation": 2,
                         "test_training_memory": 1},
    "05_compile": {"test_compile_speedup": 3, "test_break_even": 2, "test_attention": 1},
    "06_report": {"test_stages": 2, "test_ladder_table": 2, "test_end_to_end": 3, "test_html": 1},
    "07_compression": {"test_sparsity": 2, "test_pruned_accuracy": 1, "test_int8_size": 2, "test_int8_speedup": 2,
                       "test_int8_accuracy": 1, "test_distill_loss": 1, "test_distill_accuracy": 1},
}

# What each scenario loses, cell by cell, on the tiny profile: {notebook: cells that score 0}.
# Notebooks a scenario does not submit are missing and score 0; notebooks not listed score full.
LOSES = {
    "reference": {},
    "unchanged": {nb: set(cells) for nb, cells in POINTS.items()},
    # fp32 "AMP" keeps fp32 activations (graded where the lab trains in 16 bits: not on class
    # cpu), and without autocast an overflowing float16 step is applied; an uncompiled model
    # captures no graph, which fails 05 even where its speed is not graded. The other speed
    # cells are n/a on this profile (proven failing at the real profile).
    "hardcoded": {"03_amp": {"test_fp16_scaler"} | (
        set() if describe_machine().device_class == "cpu" else {"test_activation_memory"}),
                  "05_compile": {"test_compile_speedup"}},
    # correctness partners: a dropped batch fails both 02 checks; no backward fails every 03
    # check that trains; an unscaled accumulation gives other gradients than the large batch.
    "wrong-but-fast": {"02_data_loading": {"test_loader_speedup", "test_data_wait"},
                       "03_amp": {"test_accuracy", "test_amp_speedup", "test_activation_memory",
                                  "test_fp16_scaler"},
                       "04_checkpointing": {"test_accumulation"}},
    # patched labsupport functions change nothing: graded checks measure with a fresh copy.
    "monkeypatch": {"02_data_loading": set(POINTS["02_data_loading"])},
    "crash": {"01_profile": {"test_diagnose"}},
    # the interrupted cell never defined measure_throughput: both checks that call it fail.
    "infinite-loop": {"01_profile": {"test_throughput", "test_throughput_sync"}},
    "tampered": {"02_data_loading": set(POINTS["02_data_loading"])},
    # answers reused from where they used to ship (labsupport) or from the instructor's reference:
    # gone from the one, unreachable from the other, so every check calling them fails. 03's scaler
    # check and 04's accumulation call only the scenario's own (reference) code and pass; 06's
    # stages fail too, since 01 was not submitted.
    # correct but slower: speed is not graded at the tiny profile, so it keeps every point here
    # (test_the_ladder_is_the_students_own shows the slower loader in its ladder instead).
    # 01, 04, 05 and 07 not submitted: 06 finds their stages missing (the end-to-end check needs them all).
    "slow-loader": {"06_report": {"test_stages", "test_end_to_end"}},
    # Attacks on the grader (the scenarios marked attack = true in tests/scenarios/). What they did in the kernel reaches nothing else:
    # the hostile one's 01 is the reference's work and keeps its points; the others lose exactly
    # the points their own work would.
    "hostile": {},
    # 01: halved timing, graded against the grader's thresholds, not the lenient copy the kernel
    # switched to, and typed top operators, which are not the profile taken at grading time; 02:
    # the blank release (the transformer only fooled the kernel); 06: the typed stages are not the
    # grader's (its correct assemble_ladder and its export keep their points).
    "cheater": {"01_profile": {"test_throughput", "test_top_operators"},
                "02_data_loading": set(POINTS["02_data_loading"]), "06_report": {"test_stages", "test_end_to_end"}},
    # no network: diagnose raises; no course folder: the master's answer cannot be read.
    "outsider": {"01_profile": {"test_diagnose"}, "02_data_loading": set(POINTS["02_data_loading"])},
    # stopped at the disk quota, and what it wrote deleted: its carried code and trace too.
    "filler": {"01_profile": set(POINTS["01_profile"])},
    # stopped at the notebook's wall-clock budget, before its checks ran; its 02 (the blank
    # release) then finds the submission's budget spent.
    "sleeper": {"01_profile": set(POINTS["01_profile"]), "02_data_loading": set(POINTS["02_data_loading"])},
    # the blank release's 02: its attacks on the grader (the scenarios marked attack = true in tests/scenarios/) earn nothing and cost
    # nobody else anything (the students graded after it keep their exact scores).
    "lib": {"02_data_loading": set(POINTS["02_data_loading"])},
    # Correctness partners that cover what is measured (issue 17): each shortcut fails the check
    # that times it, and only that one. 02's half-resolution training images match no dataset
    # image at the profile's size; 03's step, timed (the judge's timed call on its worker's stack),
    # leaves 60 of 62 weight tensors unchanged (every timed call is checked against fp32's step from
    # the same weights; untimed, it trains them all, so the checks that time nothing keep their points); 04's one full-batch forward shows no micro-batches (its checkpointing
    # is the reference's); 05's eager model fires a forward hook in the timed calls (its
    # break_even_steps is right); 07's int8 rounding simulated in float32 stores no int8 weight
    # (its pruning is the reference's), and its distillation loss leaves the teacher out.
    "shortcuts": {"02_data_loading": set(POINTS["02_data_loading"]), "03_amp": {"test_amp_speedup"},
                  "04_checkpointing": {"test_accumulation", "test_training_memory"}, "05_compile": {"test_compile_speedup"},
                  "07_compression": {"test_int8_size", "test_int8_speedup", "test_int8_accuracy", "test_distill_loss",
                                     "test_distill_accuracy"}},
    # A real student's mistakes: the copy labelled as data wait (one of the five phases missing)
    # and operators ranked by total time, so a label and wrappers come first (01); labels shuffled
    # apart from their images (02), no scaler.update() (only the float16 check uses an enabled
    # GradScaler, and its second step raises), BatchNorm statistics updated twice by the
    # recomputation (every 04 check partnered with the gradient and statistics match;
    # accumulation does not checkpoint and keeps its points), pruning made permanent before the
    # fine-tune, which trains the zeros back (07: the pruned model's accuracy is not earned either;
    # int8 keeps its points), and the distillation loss's soft term without its T^2.
    "honest-bugs": {"01_profile": {"test_phases_labelled", "test_top_operators"},
                    "02_data_loading": set(POINTS["02_data_loading"]), "03_amp": {"test_fp16_scaler"},
                    "04_checkpointing": set(POINTS["04_checkpointing"]) - {"test_accumulation"},
                    "07_compression": {"test_sparsity", "test_pruned_accuracy", "test_distill_loss",
                                       "test_distill_accuracy"}},
    # Answers that are not the student's work (issue 59): 01's timer is labsupport's time_steps under
    # another name and its diagnosis the grader's _bottleneck (both timer checks and the diagnosis
    # lost, naming what was called); 05's break-even is asked of the check's private helper. 01's
    # labelled_step and top operators, and 05's compiled inference, are the reference's and keep
    # their points.
    "answers": {"01_profile": {"test_throughput", "test_throughput_sync", "test_diagnose"},
                "05_compile": {"test_break_even"}},
    # 01's labels around a forward and backward thrown away, the real step run outside them: it
    # trains the model handed over (the trace holds), and no label holds the step's own work.
    "other-work": {"01_profile": {"test_phases_labelled"}},
    # The same two classes in other variants: 01's timer handed to ls.pipeline.forever's timed waits,
    # and its labels around a copy of the model's forward and backward (graded in test_carry.py).
    "answers-elsewhere": {"01_profile": {"test_throughput", "test_throughput_sync", "test_phases_labelled"}},
    # The kernel's slowed PIL.Image.open never reaches the grader's baseline: full marks for a
    # correct loader, and the grader's speedup is the honest one (asserted below).
    "patched-baseline": {},
    # written differently from the master, correct: full marks (graded in test_unbatched.py)
    "variant": {},
    # correct 02-04 in other ordinary styles (module-level tensors, decorated helpers, dataclass;
    # partials, lambdas, closures): full marks, through the judge (graded in test_carry.py)
    "style-module": {}, "style-functional": {},
    # correct 01, 05, 06 and 07 the same ways (helper classes, contextmanagers, dataclasses; factories,
    # partials, lambdas, imports inside): full marks, through the judge (graded in test_carry.py)
    "style-helpers": {}, "style-closures": {},
    "reuse": {"02_data_loading": set(POINTS["02_data_loading"]),
              "03_amp": {"test_accuracy", "test_amp_speedup", "test_activation_memory"},
              "04_checkpointing": set(POINTS["04_checkpointing"]) - {"test_accumulation", "test_training_memory"},
              "05_compile": {"test_compile_speedup", "test_break_even"}, "06_report": set(POINTS["06_report"])},
}
SUBMITS = {"hardcoded": {"02_data_loading", "03_amp", "05_compile"},
           "answers": {"01_profile", "05_compile"}, "other-work": {"01_profile"}, "answers-elsewhere": {"01_profile"},
           "shortcuts": {"02_data_loading", "03_amp", "04_checkpointing", "05_compile", "07_compression"},
           "honest-bugs": {"01_profile", "02_data_loading", "03_amp", "04_checkpointing", "07_compression"},
           "patched-baseline": {"02_data_loading"}, "variant": {"02_data_loading"},
           "wrong-but-fast": {"02_data_loading", "03_amp", "04_checkpointing"},
           "monkeypatch": {"02_data_loading"}, "crash": {"01_profile"},
           "infinite-loop": {"01_profile"}, "tampered": {"02_data_loading"},
           "reuse": {"02_data_loading", "03_amp", "04_checkpointing", "05_compile", "06_report"},
           "slow-loader": set(POINTS) - {"01_profile", "04_checkpointing", "05_compile", "07_compression"}, "hostile": {"01_profile"},
           "cheater": {"01_profile", "02_data_loading", "06_report"},
           "outsider": {"01_profile", "02_data_loading"}, "filler": {"01_profile"},
           "sleeper": {"01_profile", "02_data_loading"}, "lib": {"02_data_loading"},
           "style-module": {"02_data_loading", "03_amp", "04_checkpointing"},
           "style-functional": {"02_data_loading", "03_amp", "04_checkpointing"},
           "style-helpers": {"01_profile", "05_compile", "06_report", "07_compression"},
           "style-closures": {"01_profile", "05_compile", "06_report", "07_compression"}}
# Notebooks of a scenario left out of this batch, to keep make test under 30 minutes: each one's
# wrong code is graded on its own in tests/test_checks.py (hardcoded 05's uncompiled model:
# test_05_break_even_and_outputs...; wrong-but-fast 03's missing backward and 04's unscaled
# accumulation: test_03_step_that_skips_backward_fails, test_04_accumulation_...; reuse 03 and 04
# call what 02 shows gone; shortcuts 05's decoy compile: test_05_the_timed_calls_must_run_the_models_
# compiled_graph), and hardcoded 02 and 05 at the real profile in tests/test_real_profile.py
# (hardcoded 02, the naive loader, is correct and only slow, which the tiny profile does not grade).
# honest-bugs' and shortcuts' 04 and 07 are graded without a kernel in tests/test_unbatched.py: their
# exact code, carried and checked as the verdict process does, must lose exactly their LOSES below
# (their way through the kernel is the reference's, in this batch).
NOT_HANDED_IN = {"hardcoded": ("02_data_loading", "05_compile"), "wrong-but-fast": ("03_amp", "04_checkpointing"),
                 "reuse": ("03_amp", "04_checkpointing"),
                 "shortcuts": ("04_checkpointing", "05_compile", "07_compression"),
                 "honest-bugs": ("04_checkpointing", "07_compression"), "variant": ("02_data_loading",)}
# The per-cell limit for the batch with the infinite loop: what the loop costs, and what the
# student graded after it must fit every 01 cell in. 25 s was too short beside a busy process
# (01's memory profile of a step took longer, and that student timed out).
LOOP_TIMEOUT_S = 60
SLEEPER_CELL_S = 25  # the per-cell limit in the sleeper's batch: just over the 20 s it sleeps before each cell
SLEEPER_BUDGET_S = 30  # the wall clock of one notebook in the sleeper's batch
SLEEPER_SUBMISSION_S = 45  # and of all its notebooks and verdicts together
NO_SANDBOX = sandbox.problem()
# Scenarios left out of the batch, to keep make test under 30 minutes, with where their point is
# proven instead.
OUT_OF_BATCH = {
    "hardcoded": "graded at the real profile (test_real_profile.py's test_hardcoded_answers_fail_the_"
                 "speed_checks_at_the_real_profile); at the tiny profile its 02 is a correct slow loader "
                 "and its 03's missing autocast is test_grading's fp16-without-a-scaler case",
    "variant": "its one notebook is graded without a kernel in test_unbatched.py (the carry of a helper "
               "class from a kernel's cell: test_carry.py)",
    "style-module": "its 02-04 are graded through the judge and the sandbox, without a kernel, in test_carry.py",
    "style-functional": "its 02-04 are graded through the judge and the sandbox, without a kernel, in test_carry.py",
    "answers-elsewhere": "its 01 is graded through the judge and the sandbox, without a kernel, in test_carry.py",
    "style-helpers": "its 01 and 05-07 are graded through the judge and the sandbox, without a kernel, in test_carry.py",
    "style-closures": "its 01 and 05-07 are graded through the judge and the sandbox, without a kernel, in test_carry.py",
    "monkeypatch": "verdicts run outside the kernel, so a labsupport function patched there is never called "
                   "by the grader (cheater and patched-baseline bend the kernel's side, and are graded here)",
}
# Graded one after another in the shared course (the rest in parallel, beside them): the attacks,
# tampered, and the batches with their own time limits (LATE).
LATE = ("infinite-loop", "crash", "sleeper")
SERIAL = ("lib", "hostile", "cheater", "outsider", "filler", "tampered", *LATE)
# The order the parallel batch starts them in, slowest first (kernel and verdict seconds in this
# batch, on 2 cores beside the other lanes, class cpu: reference 927 s, slow-loader 253,
# honest-bugs 223, unchanged 170, shortcuts 82, reuse 61).
LONGEST_FIRST = ("reference", "slow-loader", "honest-bugs", "unchanged", "shortcuts", "reuse",
                 "patched-baseline", "wrong-but-fast", "hardcoded", "monkeypatch")


def _longest_first(scenario: str) -> int:
    return LONGEST_FIRST.index(scenario) if scenario in LONGEST_FIRST else len(LONGEST_FIRST)


GRADED = tuple(s for s in scenarios.SCENARIOS
               if s not in OUT_OF_BATCH and not (NO_SANDBOX and s in scenarios.ATTACKS))
CHECKOUT = Path(__file__).resolve().parents[1]


def checkout_hash(*folders: Path) -> dict[str, str]:
    """``{file: sha256}`` of the files below ``folders`` (caches and the real gradebook aside), and
    of every file and link in the virtual environment, site-packages included, by its metadata
    (size, modification time, mode, link target: 47,000 files in half a second)."""
    out = {}
    for top, dirs, files in os.walk(sys.prefix):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            path = os.path.join(top, name)  # folders' own times change with any cache written in them
            info = os.lstat(path)
            link = os.readlink(path) if os.path.islink(path) else ""
            out[path] = f"{info.st_size} {info.st_mtime_ns} {info.st_mode:o} {link}"
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".db"):
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def expected_score(scenario: str, notebook: str) -> float:
    if notebook not in SUBMITS.get(scenario, POINTS) or notebook in NOT_HANDED_IN.get(scenario, ()):
        return 0.0
    lost = LOSES[scenario].get(notebook, set())
    return float(sum(p for cell, p in POINTS[notebook].items() if cell not in lost))


@pytest.fixture(scope="module")
def graded(tmp_path_factory, tiny_data):
    """A temporary course: release, every scenario in an inbox (some zipped), collect, grade."""
    tmp = tmp_path_factory.mktemp("course")
    root = tmp / "course"
    root.mkdir()
    shutil.copyfile(course.COURSE_ROOT / course.CONFIG_NAME, root / course.CONFIG_NAME)
    shutil.copytree(course.source_dir(), root / "source",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    release_dir = release.generate(root)
    inbox = tmp / "inbox"
    for scenario in GRADED:
        folder = inbox / scenario / "lab"
        scenarios.write(scenario, release_dir, root / "source" / "lab", folder)
        for name in NOT_HANDED_IN.get(scenario, ()):
            (folder / f"{name}.ipynb").unlink()
        if scenario in ("reference", "tampered"):  # these arrive as zips, as from an LMS
            with zipfile.ZipFile(inbox / f"{scenario}.zip", "w") as archive:
                for path in folder.glob("*.ipynb"):
                    archive.write(path, f"{scenario}/Copy of {path.name}" if path.name.startswith("01")
                                  else f"{scenario}/{path.name}")
            shutil.rmtree(inbox / scenario)
    (inbox / "broken.zip").write_bytes(b"PK\x03\x04 this is not a zip")
    # An inbox no student should be able to break (collected in name order, before the others):
    # a zip bomb, a student folder that is a link to the masters, and one of links inside.
    with zipfile.ZipFile(inbox / "bomb.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("bomb/01_profile.ipynb", "w", force_zip64=True) as f:
            for _ in range(collect.MAX_NOTEBOOK_BYTES // 2**20 + 8):
                f.write(b" " * 2**20)
    (inbox / "a-link").symlink_to(root / "source" / "lab")
    (inbox / "links" / "lab").mkdir(parents=True)
    (inbox / "links" / "lab" / "02_data_loading.ipynb").symlink_to(root / "source" / "lab" / "02_data_loading.ipynb")
    (inbox / "links" / "lab" / "03_amp.ipynb").symlink_to("/etc/passwd")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB_DATA", str(tiny_data))
        mp.setenv("LAB_PROFILE", "tiny")
        mp.setenv("LAB_CALIBRATION", str(tmp / "no-calibration.toml"))
        # A smaller disk quota, so that the disk fill is stopped within seconds (05's compile
        # caches, 157 MB precompiled headers among them, fit in it).
        mp.setattr(sandbox_disk, "STORE_BYTES", 2**30)
        mp.setattr(sandbox, "MAX_FILE_BYTES", 512 * 2**20)
        collected = collect.collect(inbox, root)
        checkout = (CHECKOUT / "labsupport", CHECKOUT / "autograder", CHECKOUT / "tests", root / "submitted",
                    root / "source", root / "release")
        before = checkout_hash(*checkout)
        # Two lanes at once. In the background, the scenarios that attack nobody, two at a time
        # (grade --jobs 2), each on a core of its own, slowest first: the exact scores below hold
        # for the parallel backend as for the serial one, on a machine busier than its cores.
        rest = [s for s in GRADED if s not in SERIAL]
        jobs = min(2, len(os.sched_getaffinity(0)))
        running = parallel.start(root, sorted(rest, key=_longest_first), jobs, progress=False)
        # Meanwhile, here, one after another in the shared course: the attacks beside that
        # grading (as on a shared node), then the students they aim at that are graded here;
        # tampered too, which the Slurm test compares with this serial grading.
        grades = grade.grade(root, [s for s in SERIAL if s in GRADED and s not in LATE], progress=False)
        # The infinite loop, then a student after it: the batch goes on.
        grades += grade.grade(root, ["infinite-loop", "crash"], timeout_s=LOOP_TIMEOUT_S, progress=False)
        if "sleeper" in GRADED:
            grades += grade.grade(root, ["sleeper"], timeout_s=SLEEPER_CELL_S, budget_s=SLEEPER_BUDGET_S,
                                  submission_budget_s=SLEEPER_SUBMISSION_S, progress=False)
        grades += tasks.merge(root, running.result())["grades"]
        after = checkout_hash(*checkout)
        gradebook.export(root, grades)
    return {"root": root, "collected": {c.student: c for c in collected}, "grades": grades,
            "changed": sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))}


def _grade(graded, student, notebook) -> grade.NotebookGrade:
    return next(g for g in graded["grades"] if g.student == student and g.notebook == notebook)


def test_points_table_matches_the_masters():
    assert [m.stem for m in course.graded_masters()] == list(POINTS)
    for master in course.graded_masters():
        cells = course.graded_test_cells(nbformat.read(master, as_version=4))
        points = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"] for c in cells}
        assert points == POINTS[master.stem], f"update POINTS for {master.name}: {points}"


def test_collect_reports_each_problem_and_collects_the_rest(graded):
    found = graded["collected"]
    assert "not a readable zip file" in " ".join(found["broken"].problems)
    assert found["reference"].ok and len(found["reference"].notebooks) == len(course.graded_masters())
    assert any("Copy of 01_profile.ipynb -> 01_profile.ipynb" in r for r in found["reference"].renamed)
    # the optional 08 is handed in with the rest: noted, not collected, not a problem
    assert found["reference"].not_graded == ["reference/08_distributed.ipynb: optional, not graded; it was left out"]
    assert not (graded["root"] / "submitted" / "reference" / "lab" / "08_distributed.ipynb").exists()
    crash = found["crash"]
    assert crash.notebooks == ["01_profile"]
    assert sum("is missing" in p for p in crash.problems) == len(course.graded_masters()) - 1, crash.problems
    assert not (graded["root"] / "submitted" / "broken").exists()
    # the zip bomb, the linked folder and the links cost their own students only, named
    assert any("MiB" in p for p in found["bomb"].problems) and found["bomb"].notebooks == []
    assert "a link, not followed" in found["a-link"].problems[0]
    assert found["links"].notebooks == [] and sum("a link" in n for n in found["links"].not_graded) == 2
    assert "root:" not in repr(found["links"])  # nothing of the system file was read
    assert not (graded["root"] / "submitted" / "a-link").exists()


def test_collect_rejects_unknown_and_unreadable_notebooks(tmp_path):
    root = tmp_path / "course"
    root.mkdir()
    shutil.copyfile(course.COURSE_ROOT / course.CONFIG_NAME, root / course.CONFIG_NAME)
    shutil.copytree(course.source_dir(), root / "source")
    student = tmp_path / "inbox" / "dana"
    student.mkdir(parents=True)
    (student / "notes.ipynb").write_text("{}")
    (student / "02_data_loading.ipynb").write_text("{ not json")
    result = collect.collect(tmp_path / "inbox", root)[0]
    text = " ".join(result.problems)
    assert "notes.ipynb: not a notebook of this lab" in text
    assert "02_data_loading.ipynb: not a readable notebook" in text
    assert result.notebooks == []


@pytest.mark.slow
@pytest.mark.parametrize("scenario", scenarios.SCENARIOS)
def test_scenario_scores_exactly(graded, scenario):
    if scenario in OUT_OF_BATCH:
        pytest.skip(f"not graded in this batch: {OUT_OF_BATCH[scenario]}")
    if scenario not in GRADED:
        pytest.skip(f"an attack on the grader, graded only in its sandbox, and there is none here: {NO_SANDBOX}")
    got = {nb: _grade(graded, scenario, nb).score for nb in POINTS}
    want = {nb: expected_score(scenario, nb) for nb in POINTS}
    detail = {nb: _grade(graded, scenario, nb).errors for nb in POINTS if got[nb] != want[nb]}
    assert got == want, f"{scenario}: scores per notebook differ; errors in those notebooks: {detail}"


def test_a_graded_kernel_measures_nothing_and_carries_its_code(graded):
    """Under ``grade`` each kernel's checks cells leave every check to the grader ("n/a", saying
    where it is measured) and still carry the code forward; the gradebook holds the grader's scores
    (``unchanged``: 0 on every notebook, though its kernel's test cells raised nothing). The cells
    the masters mark as demonstrations (autograder/skipping.py) are not run: each shows why."""
    from autograder import skipping
    from labsupport.grading import DEFERRED_NOTE

    marks = skipping.from_masters(graded["root"])
    for student in ("reference", "unchanged"):
        folder = graded["root"] / "autograded" / student / "lab"
        assert sorted(p.stem for p in folder.glob("*.ipynb")) == sorted(POINTS)
        for path in sorted(folder.glob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            left_out = {c.id for c in nb.cells if c.cell_type == "code"
                        and any(skipping.WHY in str(o.get("text", "")) for o in c.get("outputs", []))}
            assert left_out == marks[path.stem][0], f"{student} {path.name}: cells left out {sorted(left_out)}"
            assert all(c.execution_count is None for c in nb.cells if c.get("id") in left_out)
            shown = "".join(str(o.get("data", {}).get("text/plain", "")) + str(o.get("text", ""))
                            for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
            assert DEFERRED_NOTE[:40] in shown, f"{student} {path.name}: its checks were measured in the kernel"
            raised = [c.metadata["nbgrader"]["grade_id"] for c in course.graded_test_cells(nb)
                      if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
            assert raised == [], f"{student} {path.name}: test cells raised in the kernel: {raised}"
        assert {p.stem for p in (graded["root"] / "results" / student / "code").glob("*.pkl")} >= {
            nb[:2] for nb in POINTS}
    assert [(g.notebook, g.score) for g in graded["grades"] if g.student == "unchanged" and g.score] == []


def test_reference_gets_full_marks_on_every_check(graded):
    scores = pd.read_csv(graded["root"] / "grades_by_check.csv")
    ref = scores[(scores.student == "reference") & ~scores.needs_manual_grade.astype(bool)]
    short = ref[ref.score != ref.max_score]
    assert short.empty, short.to_string()
    assert set(ref.cell) == {c for cells in POINTS.values() for c in cells}
    # 06's written analysis waits for the instructor; left as released, nbgrader scores it 0.
    analysis = scores[scores.cell == "analysis"].set_index("student")
    assert analysis.loc["reference", "needs_manual_grade"]
    assert not analysis.loc["unchanged", "needs_manual_grade"] and analysis.loc["unchanged", "score"] == 0


def test_the_ladder_is_the_students_own(graded):
    """Two submissions that differ only in their 02 loader (both correct, one 50 ms slower per
    batch) get different ladders and a different end-to-end pipeline: every rung from 02 on, and
    06's re-measured pipeline, run the student's own loader, carried forward from 02 as its checks
    measured it."""
    import json
    import re

    results = graded["root"] / "results"
    stages = ("02-data", "03-amp")  # slow-loader hands in no 01, 04 or 05
    who = ("reference", "slow-loader")
    rate = {w: {stage: json.loads((results / w / f"{stage}.json").read_text())["metrics"]["samples_per_s"]
                for stage in stages} for w in who}
    wait = {w: {stage: json.loads((results / w / f"{stage}.json").read_text())["metrics"]["phases_ms"]["data wait"]
                for stage in stages} for w in who}
    row = {w: next(r for r in json.loads((results / w / "checks" / "06.json").read_text())
                   if r["check"] == "06-end-to-end") for w in who}
    for w in who:  # 06's own data wait, measured in its timed run and said in its note
        wait[w]["06-end-to-end"] = float(re.search(r"waiting ([0-9.]+) ms per batch", row[w]["note"]).group(1))
    print("samples/s per rung:", rate, "data wait (ms):", wait,
          "end-to-end speedup:", {w: row[w]["measured"] for w in who})
    assert "time.sleep(0.05)" in (results / "slow-loader" / "code" / "02.py").read_text()
    # Every rung from 02 on, and 06's pipeline, waits for the student's own loader: 50 ms more per
    # batch with the slower one. Asserted on the waits, a direct measure that a busy machine only
    # lengthens: a rung's throughput at the tiny scale (3 steps, separate processes) is too noisy
    # (one fresh clone measured 63.4 against 57.1 samples/s at 02, where the 50 ms should give about
    # 46), and so was 06's end-to-end ratio beside a third process (0.789 against the reference's 0.82).
    for stage in ("02-data", "03-amp", "06-end-to-end"):
        assert wait["slow-loader"][stage] > wait["reference"][stage] + 30, (stage, wait)


def test_a_library_patched_in_the_kernel_does_not_reach_the_graders_baseline(graded):
    """patched-baseline's kernel slowed PIL.Image.open, which the naive loader reads every image
    with: a speedup measured in that kernel would come out inflated. Under grade the kernel
    measures no check (its table says the grader does), and the judge runs only the carried code,
    which the patch is not in.

    The grader's two speedups are printed, not compared with a band: at the tiny profile, measured
    in different processes beside two other lanes on 2 cores, the grader's speedup of two correct
    loaders varied from 6x to 20x between runs (the reference's and patched-baseline's, 6.06 and
    20.3 in one fresh clone), so a band around the reference's failed on noise alone."""
    import json

    from labsupport.grading import DEFERRED_NOTE

    def grader(student: str) -> float:
        rows = json.loads((graded["root"] / "results" / student / "checks" / "02.json").read_text())
        return float(next(r["measured"] for r in rows if r["check"] == "02-loader-speedup"))

    notebook = graded["root"] / "autograded" / "patched-baseline" / "lab" / "02_data_loading.ipynb"
    cell = next(c for c in nbformat.read(notebook, as_version=4).cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == "graded_checks")
    table = "\n".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs)
    assert "02-loader-speedup" in table and DEFERRED_NOTE[:40] in table, table  # measured nowhere but the judge
    print(f"02 loader speedup (grader): patched-baseline {grader('patched-baseline'):.2f}x, "
          f"reference {grader('reference'):.2f}x")
    carried = (graded["root"] / "results" / "patched-baseline" / "code" / "02.py").read_text()
    assert "def make_fast_loader" in carried
    assert "PIL.Image.open" not in carried and "_slow_open" not in carried, carried


def test_the_reference_notebooks_print_no_library_noise(graded):
    """What a newcomer would read as a fault, and is not: kineto's USDT and gpuGetDeviceCount lines
    (01's profiler), the CUDA build's "No CUDA runtime" warning (05's compile on a CPU), jupyter's
    TCP warning. ls.setup() quiets the first two; grading's kernels talk over ipc."""
    noise = ("USDT:", "gpuGetDeviceCount", "No CUDA runtime", "running over TCP")
    for path in sorted((graded["root"] / "autograded" / "reference" / "lab").glob("*.ipynb")):
        text = "\n".join(str(output) for cell in nbformat.read(path, as_version=4).cells
                         for output in cell.get("outputs", []))
        found = [n for n in noise if n in text]
        assert not found, f"{path.name} printed {found}"


def test_the_references_feedback_has_no_traceback_and_no_grading_machine_path(graded):
    """What the course's own solution gets back is clean: no cell of its graded notebooks raised
    (07's report cell, after the demonstration cells the grader skips, says in a sentence that
    their table was not recorded), the summary lists no problem, and no feedback page names a folder
    of the grading machine (the course, a grade --jobs task's private copy, a submission's sandbox
    folders)."""
    import re

    root = graded["root"]
    for notebook in POINTS:
        assert _grade(graded, "reference", notebook).errors == [], (notebook, _grade(graded, "reference", notebook))
    for path in sorted((root / "autograded" / "reference" / "lab").glob("*.ipynb")):
        raised = [f"{c.get('id')}: {o.get('ename')}: {o.get('evalue')}" for c in nbformat.read(path, as_version=4).cells
                  for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert raised == [], f"{path.name}: {raised}"
    grader_paths = re.compile("|".join([re.escape(str(root)), re.escape(str(root.resolve())), r"lab-grade-\w+",
                                        r"/sandbox/(?:results|report|cwd|store|outbox|inputs|judged|work)\b"]))
    pages = sorted((root / "feedback" / "reference" / "lab").glob("*.html"))
    assert len(pages) == len(POINTS), pages
    for page in pages:
        found = grader_paths.findall(page.read_text(encoding="utf-8", errors="replace"))
        assert not found, f"{page.name} names the grading machine's folders: {sorted(set(found))[:3]}"


def test_every_notebook_of_every_submission_has_feedback(graded):
    root = graded["root"]
    for scenario in GRADED:
        names = {p.stem for p in (root / "feedback" / scenario / "lab").glob("*.html")}
        # A notebook the sandbox stopped (its disk quota, its wall clock) never finished running,
        # so nbgrader has no autograded copy to give feedback on: the summary says why instead.
        stopped = {g.notebook for g in graded["grades"] if g.student == scenario
                   and g.status in ("failed to run", "out of time")}
        want = SUBMITS.get(scenario, set(POINTS)) - set(NOT_HANDED_IN.get(scenario, ())) - stopped
        assert names == want, scenario


def test_the_parallel_batch_graded_two_at_once_each_on_a_core_of_its_own(graded):
    job = parallel.job_dir(graded["root"])
    records = [tasks.read_task(job, s) for s in tasks.students_of(job)]
    assert records and all(r is not None and r["status"] == "graded" for r in records), records
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this machine lets the tests use one core, so the batch graded one at a time")
    assert all(len(r["cores"]) == 1 for r in records)
    at_once = [(a, b) for i, a in enumerate(records) for b in records[i + 1:]
               if a["started"] < b["ended"] and b["started"] < a["ended"]]
    assert at_once, "no two submissions were graded at the same time"
    assert all(a["cores"] != b["cores"] and a["sandbox_user"] != b["sandbox_user"] for a, b in at_once)


def test_infinite_loop_is_timed_out_and_the_batch_goes_on(graded):
    loop = _grade(graded, "infinite-loop", "01_profile")
    assert loop.status == "timed out", loop
    assert loop.seconds < 6 * LOOP_TIMEOUT_S
    assert _grade(graded, "crash", "01_profile").status == "graded"  # graded after the loop
    summary = pd.read_csv(graded["root"] / "grading_summary.csv")
    assert "timed out" in set(summary.status)


def test_crash_costs_its_cell_only(graded):
    crash = _grade(graded, "crash", "01_profile")
    assert any("RuntimeError: a bug in my diagnose cell" in e for e in crash.errors), crash.errors


def test_tampering_is_reported_and_the_original_tests_run(graded):
    tampered = _grade(graded, "tampered", "02_data_loading")
    assert set(tampered.edited_cells) == {"graded_checks", "test_loader_speedup", "test_data_wait"}
    assert _grade(graded, "reference", "02_data_loading").edited_cells == []
    assert "test_loader_speedup" in grade.summary(graded["grades"]).loc["tampered", "edited read-only cells"]


def test_grades_csv_and_reports(graded):
    root = graded["root"]
    grades_csv = pd.read_csv(root / "grades.csv")
    assert set(GRADED) <= set(grades_csv.student_id)
    page = reports.class_report(root).read_text()
    assert 'class="dataframe students"' in page and 'class="dataframe checks"' in page
    assert page.count("data:image/png;base64,") >= 1
    student = reports.student_report(root, "reference").read_text()
    assert 'class="dataframe ladder"' in student and "Scores per graded cell" in student
    with pytest.raises(course.CourseError, match="grade them first"):
        reports.student_report(root, "nobody")


def test_lab_order_is_numeric_and_explicit():
    assert course.lab_order(["10_x", "02_b", "01_a"]) == ["01_a", "02_b", "10_x"]
    with pytest.raises(course.CourseError, match="number prefix"):
        course.lab_order(["01_a", "intro"])
    assert course.lab_order(p.stem for p in course.masters()) == [p.stem for p in course.masters()]


def test_cell_timeout_is_sized_per_device_class():
    from labsupport.hardware import PROFILES

    for device_class in (p for p in PROFILES if p != "tiny"):
        assert 60 <= grade.cell_timeout_s(device_class) <= 900


# --- calibration ----------------------------------------------------------------------------------

def test_derive_eases_only_what_the_reference_cannot_clear():
    from labsupport.grading import CheckSpec

    spec = CheckSpec("x", "", "higher", True, {"cpu-bf16": 2.0}, {})
    assert calibrate.derive("x", spec, "cpu-bf16", [3.0, 2.8]) == (2.0, "class default")
    value, why = calibrate.derive("x", spec, "cpu-bf16", [1.8, 1.7, 1.9])
    assert value == pytest.approx(0.85 * 1.7, abs=0.01) and "eased" in why
    assert calibrate.derive("x", spec, "cpu-bf16", [1.2])[0] == "n/a"
    lower = CheckSpec("y", "", "lower", True, {"cpu-bf16": 0.4}, {})
    assert calibrate.derive("y", lower, "cpu-bf16", [0.30])[0] == 0.4
    assert calibrate.derive("y", lower, "cpu-bf16", [0.39, 0.41])[0] == pytest.approx(0.41 / 0.85, abs=1e-3)
    assert calibrate.derive("z", CheckSpec("z", "", "higher", True, {"cpu": "n/a"}, {"cpu": "no"}), "cpu", [2.0]) == \
        ("n/a", "no")


def test_calibration_file_is_written_and_used_by_grading(tmp_path, monkeypatch, tiny_data):
    """calibrate measures the reference as grade measures a student: through the notebook's judge
    (its verdict file), not in its own process; the bar it writes is the one grading reads."""
    from autograder import verdicts as verdict_processes

    monkeypatch.setenv("LAB_DATA", str(tiny_data))
    monkeypatch.setenv("LAB_PROFILE", "tiny:grades_speed=1")
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    found, run = [], verdict_processes.run
    monkeypatch.setattr(verdict_processes, "run", lambda *a, **kw: found.append(run(*a, **kw)) or found[-1])
    path, table = calibrate.calibrate(1, path=tmp_path / "calibration.toml", only=("02-loader-speedup",),
                                      progress=False)
    assert table.loc["02-loader-speedup", "runs"] == 1
    assert [(v["notebook"], v.get("judge")) for v in found] == [("02", True)], found
    written = tomllib.loads(path.read_text())["measured"]["02-loader-speedup"]
    assert written == [pytest.approx(found[0]["checks"]["02-loader-speedup"]["measured"], rel=1e-3)]
    # and the baseline's own figures in that run, which grading compares a verdict's with
    baseline = tomllib.loads(path.read_text())["baseline"]["02-loader-speedup"]
    said = found[0]["checks"]["02-loader-speedup"]["baseline"]
    assert set(baseline) == {"baseline_step_ms", "crossing_ms"} and \
        baseline["baseline_step_ms"] == [pytest.approx(said["baseline_step_ms"], rel=1e-3)], (baseline, said)
    monkeypatch.setenv("LAB_CALIBRATION", str(path))
    lab = grading.grading_lab()  # at the profile calibrate measured at (LAB_PROFILE, read once here)
    machine = lab.machine.as_dict()
    threshold, _, why = grading.threshold_for("02-loader-speedup", machine, lab.profile.name)
    calibrated = table.loc["02-loader-speedup", "calibrated"]
    assert (threshold is None and calibrated == "n/a" and why) or threshold == pytest.approx(calibrated)
    other = dict(machine, device_name="another machine")
    assert grading.threshold_for("02-loader-speedup", other, lab.profile.name)[0] == 3.0  # class default elsewhere
    assert grading.threshold_for("02-loader-speedup", machine)[0] == 3.0  # and at the class's own profile


@pytest.mark.parametrize("device_class", ["cpu", "cpu-bf16"])
def test_calibrate_measures_only_the_checks_that_apply_on_the_machines_class(tmp_path, monkeypatch, device_class):
    """A check whose class default is n/a stays n/a whatever the reference measures, so calibrate
    does not run it (on class cpu: 03's, 05's cold compile, 06's); its row and its line in the
    file still say n/a, and why."""
    import dataclasses
    import tomllib

    from labsupport import hardware

    real = hardware.describe_machine()
    monkeypatch.setattr(hardware, "describe_machine", lambda: dataclasses.replace(real, device_class=device_class))
    asked = []

    def measure(runs, course_root, *, only, progress, baselines=None):
        asked.extend(only)
        return {check: [2.0] for check in only}, []

    monkeypatch.setattr(calibrate, "measure", measure)
    path, table = calibrate.calibrate(1, path=tmp_path / "calibration.toml", progress=False)
    specs = calibrate.calibrated_checks()
    skipped = {check for check, spec in specs.items() if spec.defaults[device_class] == "n/a"}
    assert ("05-compile-speedup" in skipped) == (device_class == "cpu")
    assert sorted(asked) == sorted(set(specs) - skipped) and list(table.index) == list(specs)
    written = tomllib.loads(path.read_text())
    for check in skipped:
        assert table.loc[check, "runs"] == 0 and table.loc[check, "calibrated"] == "n/a"
        assert table.loc[check, "why"] == written["na"][check] == specs[check].na[device_class]
        assert written["thresholds"][check] == "n/a" and check not in written["measured"]


def test_grading_uses_the_calibration_of_its_course_root(tmp_path, monkeypatch):
    monkeypatch.delenv("LAB_CALIBRATION", raising=False)
    assert course.calibration_file(tmp_path) == tmp_path / "calibration.toml"
    monkeypatch.setenv("LAB_CALIBRATION", str(tmp_path / "elsewhere.toml"))
    assert course.calibration_file(tmp_path) == tmp_path / "elsewhere.toml"


def test_benchmark_table_gives_median_spread_bar_and_margin():
    """The benchmark's table: a speedup's margin is median / bar, a share's is bar / median; n/a has none."""
    from types import SimpleNamespace

    from autograder import benchmark

    machine = SimpleNamespace(device_class="cpu-bf16")
    table = benchmark.table({"02-loader-speedup": [5.0, 6.0, 4.0], "02-data-wait-share": [0.02, 0.05, 0.04],
                             "05-compile-speedup": [1.5, 1.6]}, machine)
    assert table.loc["02-loader-speedup", "median"] == 5.0 and table.loc["02-loader-speedup", "margin"] == pytest.approx(5 / 3)
    assert table.loc["02-data-wait-share", "margin"] == pytest.approx(0.10 / 0.04)
    assert table.loc["02-loader-speedup", "min"] == 4.0 and table.loc["02-loader-speedup", "max"] == 6.0
    cpu = benchmark.table({"03-amp-speedup": [0.98]}, SimpleNamespace(device_class="cpu"))
    assert cpu.loc["03-amp-speedup", "class default"] == "n/a" and cpu.loc["03-amp-speedup", "margin"] is None


needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no grading sandbox here: {NO_SANDBOX}")


@needs_sandbox
def test_attacks_change_nothing_outside_their_own_grade(graded):
    """After the batch, the checkout, the masters, the release and every submitted notebook are as
    they were (by hash); nobody has extra credit; no process of the sandbox outlived grading; and
    the CSVs were written (the gradebook was never locked)."""
    from nbgrader.api import Gradebook

    root = graded["root"]
    assert graded["changed"] == [], f"files changed while grading: {graded['changed'][:5]}"
    with course.venv_on_path(), Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        credit = [(s, g.extra_credit) for s, g in
                  ((sub.student.id, g) for sub in gb.find_assignment("lab").submissions
                   for nb in sub.notebooks for g in nb.grades) if g.extra_credit]
    assert credit == []
    left = subprocess.run(["pgrep", "-u", str(sandbox_users.user())], capture_output=True, text=True).stdout
    assert not left.strip(), f"processes of the sandbox outlived grading: {left}"
    for name in ("grades", "grades_by_check", "grading_summary"):
        assert (root / f"{name}.csv").stat().st_size > 0


@needs_sandbox
@needs_sandbox
def test_the_forged_verdict_never_reaches_what_decides_02(graded):
    """The cheater's 02 carried code that, in the verdict process, wrote its own verdict (every
    check a pass). 02 is decided by the judge, and the code runs in a worker that sees neither the
    judge's spec nor where its verdict goes: nothing was forged, and its checks failed for what the
    code is (no loader in it). The grader's decisions stay with the course, and the feedback and
    grades_by_check.csv show the grader's table. (Root's recomputing of a forged pass from its
    measurement and the bar: tests/test_trust.py.)"""
    import json

    root = graded["root"]
    kept = json.loads((root / "verdicts" / "cheater" / "02_data_loading.json").read_text())
    assert kept["verdict_process"]["judge"] is True
    assert {c: (d["result"], d["reason"]) for c, d in kept["decided"].items()} == \
        {"02-loader-speedup": ("fail", "error"), "02-data-wait-share": ("fail", "error")}
    # Its carried make_fast_loader is the release's unwritten one (carried by value, as its kernel had it).
    assert all("NotImplementedError" in d["note"] for d in kept["decided"].values()), kept["decided"]
    by_check = pd.read_csv(root / "grades_by_check.csv", keep_default_na=False)  # "n/a" is a result here
    ref = by_check[(by_check.student == "reference") & (by_check.check != "")]
    assert set(ref.result) <= {"pass", "n/a"} and len(ref) == sum(len(c) for c in POINTS.values())
    row = by_check[(by_check.student == "cheater") & (by_check.cell == "test_loader_speedup")].iloc[0]
    # No bar shown: at the tiny profile a speed bar is n/a (thresholds.toml's `scale`, decided in
    # grading.bar); the check fails on its error whatever the bar.
    assert (row.check, row.result, row.reason, row.bar) == ("02-loader-speedup", "fail", "error", ""), row
    page = (root / "feedback" / "cheater" / "lab" / "02_data_loading.html").read_text()
    assert page.index("The grader's verdicts") < page.index("student's self-check")
    assert not any("forged" in d["note"] for d in kept["decided"].values())  # (the page shows its source)
    table = grade.summary(graded["grades"])
    assert table.loc["reference", "automatic max"] == sum(sum(c.values()) for c in POINTS.values())  # 59
    assert table.loc["reference", "max"] == table.loc["reference", "automatic max"] + 4  # 06's analysis


@needs_sandbox
def test_floods_fills_and_sleepers_are_stopped(graded):
    root = graded["root"]
    flooded = root / "autograded" / "hostile" / "lab" / "01_profile.ipynb"
    assert flooded.stat().st_size < 16 * 2**20
    assert "output truncated by the grader" in flooded.read_text()
    assert any("to disk" in e for e in _grade(graded, "filler", "01_profile").errors)
    # each submission's folders (its disk) are gone once it is graded, the filler's too
    assert not list((root / "sandbox" / "students").glob("*"))
    sleeper = _grade(graded, "sleeper", "01_profile")
    assert sleeper.seconds < SLEEPER_BUDGET_S + 30, sleeper
    # one wall clock for the whole submission: its 02 got what 01 and its verdict left, if anything
    rows = [g for g in graded["grades"] if g.student == "sleeper"]
    assert sum(g.seconds + g.verdict_s for g in rows) < SLEEPER_SUBMISSION_S + 30, rows
    later = _grade(graded, "sleeper", "02_data_loading")
    assert later.status != "graded" or any("budget" in e or "no time" in e for e in later.errors), later


@needs_sandbox
def test_what_a_verdict_process_leaves_root_follows_nowhere(graded):
    """lib's verdict process linked its store's carried code and its spec into the virtual
    environment, made its verdict file a FIFO and flooded stdout: root wrote nowhere (the venv is
    as it was: test_attacks_change_nothing_outside_their_own_grade), did not wait on the FIFO,
    kept a bounded piece of the flood, and the batch's own labsupport, which lib's folder used to
    be, served every student graded after it."""
    import json
    import sysconfig

    lib = _grade(graded, "lib", "02_data_loading")
    # 02 is the judge's: what is carried is the kernel's functions by value (its blank release's
    # make_fast_loader), not the cell's source, so the bait never runs where the grader loads the
    # code; what it would have linked or turned into a FIFO is root's and out of its sight.
    kept = json.loads((graded["root"] / "verdicts" / "lib" / "02_data_loading.json").read_text())
    assert kept["verdict_process"]["judge"] is True
    assert all("NotImplementedError" in d["note"] for d in kept["decided"].values()), kept
    assert lib.verdict_s < 120, lib
    assert not (Path(sysconfig.get_paths()["purelib"]) / "lab_root_bait.pth").exists()
    assert _grade(graded, "tampered", "02_data_loading").status == "graded"


def test_the_gradebook_is_put_back(graded, tmp_path):
    """What a submission must not change in the gradebook is restored and reported: another
    student's score, extra credit nobody gave, a score above the cell's maximum."""
    from nbgrader.api import Gradebook

    db = tmp_path / "gradebook.db"
    shutil.copyfile(graded["root"] / "gradebook.db", db)
    with course.venv_on_path(), Gradebook(f"sqlite:///{db}") as gb:
        before = deciding.snapshot(gb, "lab")
        reference = gb.find_grade("test_throughput", "01_profile", "lab", "reference")
        crash = gb.find_grade("test_trace", "01_profile", "lab", "crash")
        kept = reference.auto_score
        reference.auto_score = 0.0  # another student zeroed
        crash.extra_credit = 41.0  # extra credit nobody gave
        crash.auto_score = 99.0  # above the cell's maximum
        gb.db.commit()
        repaired = deciding.restore(gb, "lab", "crash", before)
        assert reference.auto_score == kept and crash.extra_credit is None and crash.auto_score == 0.0
    assert len(repaired) == 3, repaired


# --- a class graded on a Slurm cluster (autograder/slurm.py) ----------------------------------------

# Graded again on a one-node cluster with two fake GPUs, two tasks at a time, and compared with
# their serial grading above: a hostile submission (its fork storm and escapes run beside another
# student's task), one that loses some points, and one that loses all.
ON_SLURM = tuple(s for s in ("hostile", "tampered") if s in GRADED)  # two: two tasks at once
SLURM_WAIT_S = 600


def _wait_for_jobs(env: dict, cluster, deadline_s: float = SLURM_WAIT_S) -> None:
    import time

    import slurm_cluster

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        queued = subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=env).stdout
        if not queued.strip():
            return
        time.sleep(1)
    raise AssertionError(f"Slurm jobs still queued after {deadline_s} s: {queued}; {slurm_cluster.logs(cluster.folder)}")


def _checks(root: Path, students) -> list[dict]:
    """Every graded cell of ``students`` in ``root``'s gradebook: score, max score, needs manual
    grading, and the grader's result on its check."""
    frame = gradebook.scores_by_check(root)
    frame = frame[frame.student.isin(students)]
    # the grader's decision, not its figures (measured and note differ from run to run)
    frame = frame[["student", "notebook", "cell", "score", "max_score", "needs_manual_grade", "check", "result"]]
    return frame.sort_values(["student", "notebook", "cell"]).to_dict("records")


@pytest.mark.slow
@pytest.mark.long
@needs_sandbox
def test_a_class_graded_on_slurm_scores_exactly_as_graded_serially(graded, tmp_path, tiny_data):
    """``grade --backend slurm --submit`` on a real (one-node) Slurm cluster: the calibration job,
    then the array afterok, two tasks at once on different GPUs, then the merge afterany. The
    merged gradebook holds exactly the serial run's scores, check by check, and nobody else's entry
    changed. (The rerun of failed and missing tasks is test_slurm.py's, against a stand-in sbatch:
    it is the same submit.sh with the task ids.)"""
    import os
    import sys
    import time

    import slurm_cluster

    if slurm_cluster.problem():
        pytest.skip(f"no Slurm cluster can be started here: {slurm_cluster.problem()}")
    served = graded["root"]
    root = tmp_path / "course"
    root.mkdir()
    for name in (course.CONFIG_NAME, "gradebook.db"):
        shutil.copyfile(served / name, root / name)
    for folder in ("source", "release"):
        shutil.copytree(served / folder, root / folder)
    for student in ON_SLURM:
        shutil.copytree(served / "submitted" / student, root / "submitted" / student)
    from nbgrader.api import Gradebook

    with course.venv_on_path(), Gradebook(course.of(root).gradebook_url) as gb:  # the merge must put them back
        for student in ON_SLURM:
            gb.remove_submission("lab", student)
    others = sorted(set(GRADED) - set(ON_SLURM))
    before_others = _checks(root, others)
    env = {k: v for k, v in os.environ.items() if k != "LAB_CALIBRATION"}  # the calibration job's, in the course
    env.update(LAB_DATA=str(tiny_data), LAB_PROFILE="tiny", PYTHONPATH=str(CHECKOUT))
    command = [sys.executable, "-m", "autograder", "--course", str(root), "grade", "--backend", "slurm",
               "--max-running", "2", "--cpus-per-task", "1", "--calibrate-runs", "1", "--submit", *ON_SLURM]
    job = root / "slurm"
    try:
        with slurm_cluster.one_node_cluster(tmp_path / "cluster", gpus=2) as cluster:
            env.update(cluster.env)
            started = time.time()
            done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=CHECKOUT)
            assert done.returncode == 0, done.stderr + done.stdout
            _wait_for_jobs(env, cluster)
            wall = time.time() - started
            ran = {s: tasks.read_task(job, s) for s in ON_SLURM}
            assert all(t and t["status"] == "graded" for t in ran.values()), (ran, slurm_cluster.logs(cluster.folder))
            pids = dict(cluster.pids)
    except slurm_cluster.Unavailable as err:
        pytest.skip(f"the Slurm cluster could not be started here: {err}")
    assert not any(slurm_cluster.running(pid) for pid in pids.values()), pids
    assert tasks.unfinished(job) == []
    # At most two at once (the array's %2), and two at once on different GPUs, as different users.
    spans = sorted((t["started"], t["ended"], t["gpus"], t["sandbox_user"], s) for s, t in ran.items())
    overlapping = [(a, b) for i, a in enumerate(spans) for b in spans[i + 1:] if b[0] < a[1]]
    assert overlapping, f"no two tasks ran at once: {spans}"
    assert all(a[2] != b[2] and a[3] != b[3] for a, b in overlapping), overlapping
    assert all(sum(s[0] <= t[0] < s[1] for s in spans) <= 2 for t in spans), spans
    # Exactly the serial run's scores, check by check; nobody else's entry touched.
    merged, serial = _checks(root, ON_SLURM), _checks(served, ON_SLURM)
    assert len(merged) == len(serial) > 0
    assert [m for m, s in zip(merged, serial) if m != s] == []
    assert _checks(root, others) == before_others
    totals = pd.read_csv(root / "grades.csv").set_index("student_id").loc[list(ON_SLURM), "raw_score"]
    assert totals.to_dict() == {s: sum(expected_score(s, nb) for nb in POINTS) for s in ON_SLURM}
    for student in ON_SLURM:
        handed_in = {p.stem for p in (root / "submitted" / student / "lab").glob("*.ipynb")}
        assert {p.stem for p in (root / "feedback" / student / "lab").glob("*.html")} == handed_in
    assert (root / "reports" / "class.html").is_file() and (root / "calibration.toml").is_file()
    serial_s = sum(g.seconds + g.verdict_s for g in graded["grades"] if g.student in ON_SLURM)
    array = max(t["ended"] for t in ran.values()) - min(t["started"] for t in ran.values())
    print(f"{len(ON_SLURM)} students: serial {serial_s:.0f} s of grading; on 2 GPU slots the array took {array:.0f} s "
          f"(calibration, array and merge {wall:.0f} s from submission); tasks: "
          + ", ".join(f"{s} GPU {t['gpus']} {t['ended'] - t['started']:.0f} s" for s, t in ran.items()))
    print((job / "grade.sbatch").read_text())
