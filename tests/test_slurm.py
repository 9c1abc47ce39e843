"""The Slurm backend's scripts and its rerun (autograder/slurm.py), without a cluster.

The whole backend on a real one-node cluster (calibration, array, merge, rerun) is
``test_a_class_graded_on_slurm_scores_exactly_as_graded_serially`` in test_instructor.py. These
check, in a second, what the instructor reads and edits: the scripts' options and syntax, and that
the rerun command asks Slurm for exactly the tasks that failed or left no result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from autograder import cli, slurm, tasks

STUDENTS = ["ada", "bo", "cy", "dee"]


def sbatch_lines(path: Path) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in path.read_text().splitlines() if line.startswith("#SBATCH ")]


def test_the_scripts_ask_for_one_gpu_type_and_chain_calibration_array_and_merge(tmp_path):
    options = slurm.Options(partition="gpu", constraint="a100", max_running=3, cpus_per_task=4, time="01:30:00",
                            carried=slurm.carried({"LAB_PROFILE": "tiny", "LAB_DATA": "", "HOME": "/root"}))
    job = slurm.write(tmp_path, STUDENTS, options)
    for name in ("calibrate.sbatch", "grade.sbatch", "merge.sbatch", "submit.sh"):
        assert subprocess.run(["bash", "-n", str(job / name)]).returncode == 0, name
    grade = sbatch_lines(job / "grade.sbatch")
    assert "--array=0-3%3" in grade and "--time=01:30:00" in grade
    same_machine = ["--gres=gpu:1", "--cpus-per-task=4", "--partition=gpu", "--constraint=a100"]
    assert all(o in grade for o in same_machine) and all(o in sbatch_lines(job / "calibrate.sbatch") for o in same_machine)
    assert not any(o.startswith(("--gres", "--constraint")) for o in sbatch_lines(job / "merge.sbatch"))
    assert (job / "students.txt").read_text().split() == STUDENTS
    text = (job / "grade.sbatch").read_text()
    assert "export LAB_PROFILE=tiny" in text and "grade-task" in text and "SLURM_ARRAY_TASK_ID + 1" in text
    assert "export LAB_DATA" not in text and "export HOME" not in text  # set values of CARRIED_ENV only
    submit = (job / "submit.sh").read_text()
    assert "--dependency=afterok:$calibration grade.sbatch" in submit
    assert "--dependency=afterany:$array merge.sbatch" in submit

    whole = slurm.write(tmp_path, STUDENTS, slurm.Options(exclusive=True, calibrate_runs=None))
    assert "--exclusive" in sbatch_lines(whole / "grade.sbatch")
    assert not any(o.startswith("--gres") for o in sbatch_lines(whole / "grade.sbatch"))
    assert "calibrate.sbatch" not in (whole / "submit.sh").read_text()  # the course's calibration is kept
    assert not (whole / "calibrate.sbatch").exists()


def test_rerun_submits_only_the_failed_and_missing_tasks_then_merges(tmp_path, capsys):
    """One command, ``grade --backend slurm --rerun --submit``: tasks 1 (failed) and 3 (no
    result) go to sbatch as ``--array=1,3%2``, with the merge after them and no calibration. The
    sbatch here is a stand-in on PATH that logs its arguments."""
    course = tmp_path / "course"
    job = slurm.write(course, STUDENTS, slurm.Options(max_running=2))
    for student, status in (("ada", "graded"), ("bo", "failed"), ("cy", "graded")):
        (job / "tasks" / student).mkdir(parents=True)
        (job / "tasks" / student / "task.json").write_text(json.dumps({"student": student, "status": status}))
    assert tasks.unfinished(job) == [1, 3]
    bin_dir, log = tmp_path / "bin", tmp_path / "sbatch.log"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {log}\necho $(wc -l < {log})\n')
    (bin_dir / "sbatch").chmod(0o755)
    env_path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    os.environ["PATH"], saved = env_path, os.environ["PATH"]
    try:
        assert cli.main(["--course", str(course), "grade", "--backend", "slurm", "--rerun", "--submit"]) == 0
    finally:
        os.environ["PATH"] = saved
    calls = log.read_text().splitlines()
    assert calls == ["--parsable --array=1,3%2 grade.sbatch", "--parsable --dependency=afterany:1 merge.sbatch"]
    assert "bo, dee" in capsys.readouterr().out


def test_a_task_that_cannot_grade_says_why_and_fails(tmp_path):
    """A task whose course has no such submission fails (exit 1, so Slurm marks it FAILED) and
    leaves task.json with the reason, which the merge reports and the rerun picks up."""
    course = tmp_path / "course"
    course.mkdir()
    job = slurm.write(course, ["ghost"], slurm.Options())
    done = subprocess.run([sys.executable, "-m", "autograder", "--course", str(course), "grade-task",
                           f"--job={job}", "ghost"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 1
    record = tasks.read_task(job, "ghost")
    assert record["status"] == "failed" and record["error"], record
    assert tasks.unfinished(job) == [0]


def test_rerun_without_a_job_says_what_to_run(tmp_path, capsys):
    assert cli.main(["--course", str(tmp_path), "grade", "--backend", "slurm", "--rerun"]) == 1
    assert "write the job first" in capsys.readouterr().err
