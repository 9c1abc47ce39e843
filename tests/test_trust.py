"""The trust boundary between root and what a sandbox wrote (autograder/boundary.py), the limits of
a submission (memory, disk) and collect's inbox, one class of attack at a time, in seconds.

The whole of it, on a hostile submission in a graded batch, is test_instructor.py's ``lib``
scenario. The sandboxed ones need root and bubblewrap (``make test`` installs it) and skip
visibly without them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zipfile

import pytest

from autograder import boundary, collect, course, sandbox, sandbox_disk, sandbox_memory, sandbox_users

needs_sandbox = pytest.mark.skipif(sandbox.problem() is not None,
                                   reason=f"no grading sandbox here: {sandbox.problem()}")


# --- what root reads ----------------------------------------------------------------------------

@pytest.fixture
def written(tmp_path):
    """A folder as a sandbox leaves it: a file, a link to a secret, a FIFO, a big file, a link
    to a folder."""
    folder, secret = tmp_path / "w", tmp_path / "secret.txt"
    (folder / "sub").mkdir(parents=True)
    secret.write_text("root's")
    (folder / "ok.json").write_text('{"a": 1}')
    (folder / "sub" / "inner.txt").write_text("inner")
    (folder / "link.json").symlink_to(secret)
    (folder / "linked-folder").symlink_to(tmp_path)
    os.mkfifo(folder / "fifo.json")
    with open(folder / "big.bin", "wb") as f:
        f.truncate(3 * 2**20)
    return folder, secret


def test_read_takes_regular_files_only_and_never_waits(written):
    folder, _ = written
    assert boundary.read(folder, "ok.json") == b'{"a": 1}'
    assert boundary.read(folder, "sub/inner.txt") == b"inner"
    for name, why in (("link.json", "not a regular file"), ("fifo.json", "not a regular file"),
                      ("linked-folder/secret.txt", "not a folder"), ("../secret.txt", "plain relative")):
        started = time.monotonic()
        with pytest.raises(boundary.Refused, match=why):
            boundary.read(folder, name)
        assert time.monotonic() - started < 1, name  # the FIFO did not block
    with pytest.raises(boundary.Refused, match="larger than"):
        boundary.read(folder, "big.bin", cap=2**20)
    with pytest.raises(FileNotFoundError):
        boundary.read(folder, "none.json")


def test_copy_tree_copies_files_and_skips_the_rest_with_a_note(written, tmp_path):
    folder, secret = written
    dest = tmp_path / "kept"
    skipped = boundary.copy_tree(folder, dest, file_cap=2**20)
    assert (dest / "ok.json").read_text() == '{"a": 1}' and (dest / "sub" / "inner.txt").read_text() == "inner"
    assert not (dest / "link.json").exists() and not (dest / "fifo.json").exists()
    assert not (dest / "big.bin").exists() and not (dest / "linked-folder").exists()
    assert {s.split(":")[0] for s in skipped} >= {"link.json", "fifo.json", "big.bin"}
    assert secret.read_text() == "root's"


def test_write_never_follows_a_link(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("root's")
    (tmp_path / "dest.txt").symlink_to(secret)
    boundary.write(tmp_path / "dest.txt", b"new")
    assert secret.read_text() == "root's" and (tmp_path / "dest.txt").read_bytes() == b"new"
    assert not (tmp_path / "dest.txt").is_symlink()


def test_give_replaces_what_a_sandbox_left_without_following_it(written):
    """Root puts the grader's rungs into a kernel's own results store (submission._give_rungs):
    a link left at the name is replaced, not written through; a FIFO does not block; a folder
    there is refused; nothing may name a path outside."""
    folder, secret = written
    for name in ("link.json", "fifo.json", "ok.json", "new.json"):
        started = time.monotonic()
        boundary.give(folder, name, b"rung", owner=os.getuid())
        assert time.monotonic() - started < 1, name
        assert (folder / name).read_bytes() == b"rung" and not (folder / name).is_symlink(), name
    assert secret.read_text() == "root's"
    with pytest.raises(boundary.Refused, match="could not be replaced"):
        boundary.give(folder, "sub", b"rung")
    for name in ("../secret.txt", "sub/inner.txt", ".."):
        with pytest.raises(boundary.Refused, match="plain file name"):
            boundary.give(folder, name, b"rung")
    assert secret.read_text() == "root's" and (folder / "sub" / "inner.txt").read_text() == "inner"


def test_run_keeps_a_bounded_piece_of_a_flood_and_stops_at_its_time():
    flood = "import sys\nfor _ in range(300): print('x' * 2**20)\nprint('end')"
    done = boundary.run([sys.executable, "-c", flood], env=dict(os.environ), timeout_s=60, cap=2**16)
    assert done.returncode == 0 and len(done.output) < 2**16 + 200
    assert done.dropped > 250 * 2**20 and done.last_line() == "end"
    started = time.monotonic()
    slow = boundary.run([sys.executable, "-c", "import time; time.sleep(60)"], env=dict(os.environ), timeout_s=2)
    assert slow.timed_out and time.monotonic() - started < 10


# --- what a sandbox may use -------------------------------------------------------------------

@needs_sandbox
def test_memory_is_limited_per_grader(monkeypatch, tmp_path):
    procs, why = sandbox_memory.memory_cgroup()
    if procs is None:
        pytest.skip(f"no memory cgroup on this machine: {why}")
    sandbox_memory.memory_cgroup.cache_clear()
    monkeypatch.setattr(sandbox_memory, "memory_bytes", lambda: 256 * 2**20)
    try:
        sandbox_memory.memory_cgroup()
        kills = sandbox_memory.memory_kills()
        box = sandbox.Sandbox(writable=(), readable=())
        hog = "x = bytearray(1024 * 2**20); x[::4096] = b'y' * len(x[::4096]); print('survived')"
        done = subprocess.run(box.command([sys.executable, "-c", hog]), capture_output=True, text=True, timeout=120)
        assert "survived" not in done.stdout and done.returncode != 0, done
        assert sandbox_memory.memory_kills() > kills
    finally:
        monkeypatch.undo()
        sandbox_memory.memory_cgroup.cache_clear()
        sandbox_memory.memory_cgroup()  # the real limit again, for the graders after this test


@needs_sandbox
def test_disk_counts_unlinked_files_and_a_tmpfs_counts_everything(tmp_path):
    folder = tmp_path / "store"
    sandbox_users.own(folder)
    box = sandbox.Sandbox(writable=(folder,), readable=())
    hold = (f"import os, time\nf = open({str(folder / 'held.bin')!r}, 'wb')\nf.write(b'0' * 32 * 2**20)\n"
            f"f.flush()\nos.unlink(f.name)\nprint('held', flush=True)\ntime.sleep(60)")
    proc = subprocess.Popen(box.command([sys.executable, "-c", hold]), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert sandbox_disk.folder_bytes(folder) == 0
        assert sandbox_disk.disk_used((folder,)) >= 32 * 2**20
    finally:
        proc.kill()
        proc.wait()
        sandbox_users.kill_all()
    disk = tmp_path / "disk"
    why = sandbox_disk.mount_disk(disk, 16 * 2**20)
    if why:
        pytest.skip(f"no tmpfs can be mounted here ({why}): the watchdog counts files instead")
    try:
        sandbox_users.own(disk / "w")
        box = sandbox.Sandbox(writable=(disk / "w",), readable=())
        fill = f"open({str(disk / 'w' / 'f')!r}, 'wb').write(b'0' * 32 * 2**20)"
        done = subprocess.run(box.command([sys.executable, "-c", fill]), capture_output=True, text=True, timeout=60)
        assert "No space left" in done.stderr
        assert 15 * 2**20 < sandbox_disk.disk_used((), disk) <= 16 * 2**20
    finally:
        sandbox_disk.unmount_below(disk)
    assert not sandbox_disk.is_mount(disk)


# --- collect ------------------------------------------------------------------------------------

@pytest.fixture
def course_root(tmp_path):
    import shutil

    root = tmp_path / "course"
    root.mkdir()
    shutil.copyfile(course.COURSE_ROOT / course.CONFIG_NAME, root / course.CONFIG_NAME)
    shutil.copytree(course.source_dir(), root / "source",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return root


def test_collect_survives_any_inbox(course_root, tmp_path):
    """Links are skipped with a note (to a master, to a system file, the entry itself), a zip
    bomb and an over-long id cost their own student only, and the honest student is collected."""
    inbox = tmp_path / "inbox"
    masters = course.masters_dir(course_root)
    honest = inbox / "honest" / "lab"
    honest.mkdir(parents=True)
    for path in course.graded_masters(course_root):
        (honest / path.name).write_bytes(path.read_bytes())
    linker = inbox / "linker"
    linker.mkdir()
    (linker / "02_data_loading.ipynb").symlink_to(masters / "02_data_loading.ipynb")
    (linker / "03_amp.ipynb").symlink_to("/etc/passwd")
    (linker / "lab").symlink_to(masters)
    (inbox / "elsewhere").symlink_to(masters)
    with zipfile.ZipFile(inbox / "bomb.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("lab/01_profile.ipynb", "w", force_zip64=True) as f:
            for _ in range(collect.MAX_NOTEBOOK_BYTES // 2**20 + 8):
                f.write(b" " * 2**20)
    (inbox / ("x" * 80)).mkdir()
    found = {c.student: c for c in collect.collect(inbox, course_root)}
    assert found["honest"].ok and len(found["honest"].notebooks) == len(course.graded_masters(course_root))
    linked = found["linker"]
    assert linked.notebooks == [] and sum("link" in n for n in linked.not_graded) == 3, linked
    assert "root:" not in repr(linked)
    assert "a link, not followed" in found["elsewhere"].problems[0]
    assert "01_profile" not in found["bomb"].notebooks and any("MiB" in p for p in found["bomb"].problems)
    assert "not a usable student id" in found["x" * 80].problems[0]
    assert not (course_root / "submitted" / "linker" / "lab" / "02_data_loading.ipynb").exists()


@pytest.mark.parametrize("student", ["..", "../x", "a/b", ".hidden", "", "x" * 65, "-flag"])
def test_student_ids_that_are_paths_are_refused(student):
    with pytest.raises(course.CourseError, match="not a usable student id"):
        course.check_student_id(student)


def test_a_student_id_never_names_a_folder_of_the_batch(tmp_path):
    from autograder import batch

    for student in ("lib", "batch", "spec", "students"):
        work = batch.Folders(tmp_path / "sandbox" / "students" / course.check_student_id(student)).work
        assert (tmp_path / "sandbox" / "batch") not in (work, *work.parents)
        assert work.parent == tmp_path / "sandbox" / "students"


# --- what root decides from a verdict -------------------------------------------------------------

@pytest.fixture
def judged(monkeypatch, tmp_path):
    """This machine at the class's own scale (speed graded), with no calibration file."""
    from labsupport import hardware

    monkeypatch.delenv("LAB_PROFILE", raising=False)
    monkeypatch.delenv("LAB_THRESHOLDS", raising=False)
    monkeypatch.setenv("LAB_CALIBRATION", str(tmp_path / "none.toml"))
    return hardware.describe_machine(hardware.pick_device())


def _verdict(**checks):
    return {"notebook": "02", "checks": {c.replace("_", "-"): e for c, e in checks.items()}}


def test_a_pass_is_recomputed_from_the_measurement_and_the_bar(judged):
    from autograder import deciding

    said = {"status": "pass", "reason": "pass", "threshold": 0.5, "note": "forged"}
    found = deciding.decide(_verdict(**{"02_loader_speedup": {**said, "measured": 0.951},
                                        "02_data_wait_share": {**said, "measured": 0.05}}),
                            ["02-loader-speedup", "02-data-wait-share"], judged)
    speed, wait = found["02-loader-speedup"], found["02-data-wait-share"]
    assert (speed.result, speed.reason, speed.bar) == ("fail", "below bar", ">= 3"), speed
    assert (wait.result, wait.reason, wait.bar) == ("pass", "pass", "<= 0.1"), wait
    # what could pass for a number, and is not one, passes nothing
    for fake in ("9", float("nan"), float("inf"), True, None, [9], {"x": 9}):
        got = deciding.decide(_verdict(**{"02_loader_speedup": {**said, "measured": fake}}),
                              ["02-loader-speedup"], judged)["02-loader-speedup"]
        assert got.result == "fail" and got.reason == "not measured", (fake, got)


def test_only_this_machine_says_what_does_not_apply(judged):
    from autograder import deciding

    na = {"status": "n/a", "reason": "n/a", "measured": None, "note": "not applicable, says the verdict"}
    found = deciding.decide(_verdict(**{"02_loader_speedup": na, "03_amp_speedup": na}),
                            ["02-loader-speedup", "03-amp-speedup"], judged)
    assert found["02-loader-speedup"].result == "fail" and "has a bar (>= 3)" in found["02-loader-speedup"].note
    expected = "n/a" if judged.device_class == "cpu" else "fail"  # 03's speed has no bar on class cpu only
    assert found["03-amp-speedup"].result == expected, found["03-amp-speedup"]


def test_a_failure_stands_and_a_missing_check_fails(judged):
    from autograder import deciding

    found = deciding.decide({"checks": {"02-loader-speedup": {"status": "fail", "reason": "incorrect",
                                                              "measured": 50.0, "note": "pixels differ"},
                                        "02-data-wait-share": {"status": "maybe", "reason": "pass"}}},
                            ["02-loader-speedup", "02-data-wait-share", "01-trace"], judged)
    assert [(d.result, d.reason) for d in found.values()] == [("fail", "incorrect"), ("fail", "error"),
                                                              ("fail", "not run")]
    assert deciding.cell_scores(found, {"a": ["02-loader-speedup"], "b": [], "c": ["01-trace"]}) == \
        {"a": False, "b": False, "c": False}
    broken = deciding.decide({"error": "the verdict process wrote no verdicts"}, ["01-trace"], judged)
    assert broken["01-trace"].reason == "not run" and "wrote no verdicts" in broken["01-trace"].note


def test_a_speedup_far_above_the_references_waits_for_a_person(judged, monkeypatch, tmp_path):
    from autograder import deciding
    from labsupport import hardware

    cal = tmp_path / "calibration.toml"
    cal.write_text(f'[machine]\ndevice_class = "{judged.device_class}"\ndevice_name = "{judged.device_name}"\n'
                   f'cpu_cores = {judged.cpu_cores}\n[calibration]\nprofile = "{hardware.profile_for(judged.profile).name}"\n'
                   '[thresholds]\n"02-loader-speedup" = 3.0\n[measured]\n"02-loader-speedup" = [5.0, 5.5]\n')
    monkeypatch.setenv("LAB_CALIBRATION", str(cal))
    said = {"status": "pass", "reason": "pass", "note": ""}
    got = {m: deciding.decide(_verdict(**{"02_loader_speedup": {**said, "measured": m}}),
                              ["02-loader-speedup"], judged)["02-loader-speedup"] for m in (12.0, 22.0, 2150.0)}
    assert got[12.0].result == "pass"
    for m in (22.0, 2150.0):
        assert (got[m].result, got[m].reason) == ("review", "far above the reference") and not got[m].passed
        assert "the reference's best (5.5)" in got[m].note, got[m].note
    assert deciding.cell_scores({"02-loader-speedup": got[22.0]}, {"t": ["02-loader-speedup"]}) == {"t": False}


def test_a_pass_whose_baseline_strays_from_its_calibration_waits_for_a_person(judged, monkeypatch, tmp_path):
    """A pass measured against a baseline that was not itself (its step or 02's naive wait more than
    BASELINE_OFF from what calibrate measured for it here: slowed by processes the judge failed to
    stop, or a busy machine) is held for review, never passed; where nothing was calibrated the note
    says the baseline was not checked."""
    from autograder import deciding
    from labsupport import hardware

    said = {"status": "pass", "reason": "pass", "note": ""}

    def decided(baseline):
        row = {**said, "measured": 5.0, **({"baseline": baseline} if baseline is not None else {})}
        found = deciding.decide(_verdict(**{"02_loader_speedup": row}), ["02-loader-speedup"], judged)
        return found["02-loader-speedup"]

    uncalibrated = decided({"baseline_step_ms": 400.0})
    assert uncalibrated.result == "pass" and "not checked: nothing calibrated" in uncalibrated.note, uncalibrated
    cal = tmp_path / "calibration.toml"
    cal.write_text(f'[machine]\ndevice_class = "{judged.device_class}"\ndevice_name = "{judged.device_name}"\n'
                   f'cpu_cores = {judged.cpu_cores}\n[calibration]\nprofile = "{hardware.profile_for(judged.profile).name}"\n'
                   '[thresholds]\n"02-loader-speedup" = 3.0\n[measured]\n"02-loader-speedup" = [5.0, 5.5]\n'
                   '[baseline]\n"02-loader-speedup" = {baseline_step_ms = [40.0, 44.0, 42.0], crossing_ms = [0.4]}\n')
    monkeypatch.setenv("LAB_CALIBRATION", str(cal))
    assert decided({"baseline_step_ms": 50.0, "crossing_ms": 0.5}).result == "pass"
    for baseline, why in (({"baseline_step_ms": 130.0, "crossing_ms": 0.4}, "baseline_step_ms read 130, against 42"),
                          ({"baseline_step_ms": 42.0, "crossing_ms": 0.1}, "crossing_ms read 0.1, against 0.4"),
                          ({"crossing_ms": 0.4}, "baseline_step_ms was not reported"), (None, "not reported")):
        got = decided(baseline)
        assert (got.result, got.reason) == ("review", "baseline off its calibration") and not got.passed, got
        assert why in got.note, got.note


def test_the_verdict_kept_is_bounded_plain_data(judged, tmp_path):
    import json

    from autograder import deciding

    hostile = {"checks": {"02-loader-speedup": {"status": "pass", "measured": 4.0, "note": "x" * 10**6,
                                                "reason": {"nested": [1, 2]}}, **{f"extra-{i}": {} for i in range(1000)}},
               "problems": ["p" * 10**5] * 10**3, "rung": "fast", "seconds": float("nan")}
    decided = deciding.decide(hostile, ["02-loader-speedup"], judged)
    path = deciding.keep(tmp_path, "dana", "02_data_loading", hostile, decided)
    kept = json.loads(path.read_text())
    assert path.stat().st_size < 20_000 and kept["verdict_process"]["rung"] is None
    assert list(kept["verdict_process"]["checks"]) == ["02-loader-speedup"]
    assert deciding.kept(tmp_path, "dana", "02_data_loading")["02-loader-speedup"]["result"] == "pass"
    assert deciding.noted(tmp_path, "dana", "02_data_loading") == ["p" * deciding.NOTE_CHARS] * 20


def test_carried_code_changed_after_its_check_is_noted_and_root_keeps_the_measured_copy(tmp_path):
    """A later notebook's kernel that rewrites (or removes) an earlier notebook's carried code in
    its results store changes nothing the judge takes (root's copy, kept when that notebook was
    judged), and the student is told; a link in its place is not followed."""
    from autograder import verdicts
    from autograder.batch import Folders

    dirs = Folders(tmp_path / "work")
    (dirs.judged / "code").mkdir(parents=True)
    (dirs.results / "code").mkdir(parents=True)
    measured = "def make_fast_loader(lab):\n    return 'measured'\n"
    (dirs.judged / "code" / "02.py").write_text(measured)
    (dirs.results / "code" / "02.py").write_text(measured)
    assert verdicts._changed_since_checked(dirs, "code/02.py") == ""
    assert verdicts._changed_since_checked(dirs, "code/03.py") == ""  # nothing judged yet: nothing to compare
    (dirs.results / "code" / "02.py").write_text(measured.replace("measured", "faster"))
    note = verdicts._changed_since_checked(dirs, "code/02.py")
    assert "not the code notebook 02's checks measured" in note and "used the code they measured" in note
    (dirs.results / "code" / "02.py").unlink()
    (dirs.results / "code" / "02.py").symlink_to(dirs.judged / "code" / "02.py")  # the same bytes, through a link
    assert "not the code" in verdicts._changed_since_checked(dirs, "code/02.py")
    (dirs.results / "code" / "02.py").unlink()
    assert "removed" in verdicts._changed_since_checked(dirs, "code/02.py")
    assert (dirs.judged / "code" / "02.py").read_text() == measured


def test_nbgrader_autograde_alone_refuses_to_grade(course_root):
    """``nbgrader autograde`` with the course's config would let each kernel decide its own test
    cells, unsandboxed: the config puts a stand-in where nbgrader's Execute runs, which refuses
    and names the grader's command; ``python -m autograder grade`` swaps it for its sandboxed run."""
    from nbgrader.converters import Autograde
    from nbgrader.preprocessors import Execute

    from autograder import gradebook

    app = gradebook.app(Autograde, course_root)
    standing = [pp for pp in app.autograde_preprocessors if getattr(pp, "replaced_by_the_grader", False)]
    assert Execute not in app.autograde_preprocessors and len(standing) == 1
    with pytest.raises(RuntimeError, match="python -m autograder grade"):
        standing[0]().preprocess(None, {})


# --- what the verdict process loads ---------------------------------------------------------------

NAIVE_AS_ANSWER = '''
def make_fast_loader(lab, split="train", augment=True):
    return ls.pipeline.naive_loader(lab.profile, split=split, augment=augment)
'''
LOADED_WITH = {
    # one decorator on the graded function, which bends the judge when the code is loaded
    "decorator": '''
import labsupport.grading as _grading


def _kindly(fn):
    _real = _grading.judge
    _grading.judge = lambda check, measured, machine, **kw: _real(
        check, measured, machine, **{**kw, "correct": True, "optimised": True})
    return fn

''' + NAIVE_AS_ANSWER.replace("\ndef make_fast_loader", "\n@_kindly\ndef make_fast_loader"),
    # a library the baseline uses, slowed when the code is loaded (not while it is measured)
    "slowed-library": '''
import time

import PIL.Image

_open = PIL.Image.open


def _slow_open(*args, **kwargs):
    time.sleep(0.01)
    return _open(*args, **kwargs)


PIL.Image.open = _slow_open
''' + NAIVE_AS_ANSWER,
    # labsupport's own naive loader (the baseline) replaced when the code is loaded
    "replaced-baseline": '''
import labsupport.pipeline as _pipeline

_naive = _pipeline.naive_loader
_pipeline.naive_loader = lambda *args, **kwargs: _naive(*args, **kwargs)
''' + NAIVE_AS_ANSWER,
    # a partner's method replaced on its class: every epoch "checked" finds nothing wrong
    "partner-method": '''
import labsupport.grading.partners as _partners

_partners.EpochRecorder.problems = lambda self, *args, **kwargs: ""
''' + NAIVE_AS_ANSWER,
    # the baseline's code swapped inside the function object, which an identity check would miss
    "swapped-code": '''
import labsupport.pipeline as _pipeline


def _slowed(*args, **kwargs):
    raise RuntimeError("the baseline, slowed")


_pipeline.naive_loader.__code__ = _slowed.__code__
''' + NAIVE_AS_ANSWER,
}


@pytest.mark.parametrize("how", sorted(LOADED_WITH))
def test_code_that_patches_what_measures_it_when_loaded_fails_every_check(how, tiny_data, tmp_path):
    """The verdict process loads the carried code; code that, as it loads, replaces the judge, a
    library the baseline runs, labsupport's baseline or a partner's method, or swaps a function's
    code in place, fails every check of its notebook, unrun."""
    import json

    from labsupport import grading

    from test_judge import carried  # kept as a kernel keeps it, with the cell run again as it loads

    store = tmp_path / "store"
    carried({"02": LOADED_WITH[how]}, store / "code")
    spec = {"notebook": "02", "profile": "tiny", "thresholds": str(grading.thresholds_path()),
            "calibration": None, "store": str(store), "report": str(tmp_path / "report.html"),
            "data": str(tiny_data), "since": 0, "out": str(tmp_path / "verdict.json"), "inputs": None}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, "-m", "labsupport.grading.verdict", str(tmp_path / "spec.json")],
                          capture_output=True, text=True, timeout=300)
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert set(verdict["checks"]) == {"02-loader-speedup", "02-data-wait-share"}, done.stderr[-2000:]
    for check, found in verdict["checks"].items():
        assert found["status"] == "fail" and "when it was loaded" in found["note"], (check, found)
    named = {"decorator": "labsupport.grading.judge", "slowed-library": "PIL.Image.open",
             "replaced-baseline": "labsupport.pipeline.naive_loader", "swapped-code": "labsupport.pipeline.naive_loader",
             "partner-method": "labsupport.grading.partners.EpochRecorder.problems"}[how]
    assert named in verdict["problems"][0] and verdict["rung"] is None, verdict["problems"]
