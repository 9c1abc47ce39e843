"""Grade a class on a Slurm cluster: one submission per array task, merged back into nbgrader.

Speed is measured, so a submission needs its GPU (or node) to itself, and one machine grades one
submission at a time: 200 students at about 4.5 minutes each take 15 hours. On a cluster they
run side by side. ``python -m autograder grade --backend slurm`` writes a job folder,
``<course>/slurm/`` by default, and with ``--submit`` submits it:

- ``students.txt``: the students, one per line; array task ``i`` grades line ``i + 1``.
- ``calibrate.sbatch``: the dataset, then ``calibrate`` on the same kind of node as the tasks
  (same partition, constraint and GPU request), since the bars are that machine's.
- ``grade.sbatch``: the job array, one student per task, each with one whole GPU
  (``--gres=gpu:1``) or a whole node (``--exclusive``), at most ``--max-running`` at once.
- ``merge.sbatch``: ``python -m autograder merge``, after every task, whatever each one did.
- ``submit.sh``: submits the three, the array ``afterok`` the calibration and the merge
  ``afterany`` the array; ``bash submit.sh 3,7`` regrades tasks 3 and 7 only, then merges.

They are plain scripts, written to be read and edited. Each task (:func:`.tasks.run_task`) grades its
student exactly as ``grade`` does locally, sandbox included, in a private copy of the course on
the node's local disk (``TMPDIR``): its own gradebook, sandbox folders and compile caches, so
tasks share nothing but the read-only course, dataset and code. It leaves its student's graded
files and a ``task.json`` (its grades, start, end, node and GPU) in ``tasks/<student>/``.

The merge (:func:`.tasks.merge`) copies each task's gradebook entries into the course's gradebook
through nbgrader's API, brings back the autograded notebooks, measurements and reports,
regenerates the feedback, the CSVs and the class report, and names every task that failed or
left no result. ``grade --backend slurm --rerun --submit`` regrades exactly those, in one command.
"""

from __future__ import annotations

import datetime as dt
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import course, tasks

JOB_DIR = "slurm"  # in the course root
# The environment a task inherits from the instructor's shell at writing time and must keep: the
# lab's settings, and the CPU kind a run may simulate. Written into the scripts as exports
# (Options.carried: the command line reads them, :func:`carried`).
CARRIED_ENV = ("LAB_PROFILE", "LAB_DATA", "LAB_CALIBRATION", "LAB_THRESHOLDS", "LAB_DEVICE",
               "ONEDNN_MAX_CPU_ISA")


@dataclass
class Options:
    """How the array asks Slurm for machines (the ``grade --backend slurm`` options)."""

    partition: str | None = None  # every task on one GPU type: a partition ...
    constraint: str | None = None  # ... and/or a node feature (e.g. a100)
    exclusive: bool = False  # a whole node per task, instead of one GPU
    max_running: int = 8  # tasks at once (the array's %N)
    cpus_per_task: int | None = None  # CPUs beside the GPU (None: the partition's default)
    time: str = "03:00:00"  # per task; a submission takes minutes, a hostile one its budgets
    calibrate_runs: int | None = 3  # None: keep the course's calibration, submit no calibration job
    timeout_s: int | None = None  # grade's per-cell limit (default: the device class's)
    carried: dict[str, str] = field(default_factory=dict)  # CARRIED_ENV's values, exported by every script

    def resources(self) -> list[str]:
        """The ``#SBATCH`` options that pick the machine, shared by the calibration and the array."""
        lines = ["--exclusive" if self.exclusive else "--gres=gpu:1"]
        lines += [f"--cpus-per-task={self.cpus_per_task}"] if self.cpus_per_task else []
        lines += [f"--partition={self.partition}"] if self.partition else []
        lines += [f"--constraint={self.constraint}"] if self.constraint else []
        return lines


def carried(environ) -> dict[str, str]:
    """What of ``environ`` (the command line's ``os.environ``) every task must keep: CARRIED_ENV's set values."""
    return {k: environ[k] for k in CARRIED_ENV if environ.get(k)}


def job_dir(where: course.Course | Path) -> Path:
    return course.of(where).root / JOB_DIR


# --- writing and submitting -----------------------------------------------------------------------

def write(where: course.Course | Path, students: list[str], options: Options, job: Path | None = None) -> Path:
    """Write the job folder (students.txt, the sbatch scripts, submit.sh); returns it.

    A folder from an earlier term's grading is replaced, task results included.
    """
    the = course.of(where)
    job = Path(job or job_dir(the)).resolve()
    if job.exists():
        shutil.rmtree(job)
    (job / "logs").mkdir(parents=True)
    tasks.write_students(job, students)
    python = Path(sys.executable)
    run = [str(python), "-m", "autograder", "--course", str(the.root)]
    when = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    exports = [f"export {k}={shlex.quote(v)}" for k, v in options.carried.items() if k in CARRIED_ENV and v]
    head = ["#!/bin/bash"]
    preamble = ["set -euo pipefail", f"cd {shlex.quote(str(course.REPO_ROOT))}", *exports]

    def script(name: str, comment: list[str], sbatch: list[str], body: list[str]) -> None:
        text = [*head, *(f"# {c}" for c in comment), *(f"#SBATCH {o}" for o in sbatch), "", *preamble, *body]
        path = job / name
        path.write_text("\n".join(text) + "\n")
        path.chmod(0o755)

    origin = f"Written by `python -m autograder grade --backend slurm` on {when}; edit freely."
    timeout = [f"--timeout={options.timeout_s}"] if options.timeout_s else []
    calibrate = options.calibrate_runs is not None
    if calibrate:
        script("calibrate.sbatch",
               [origin, "The bars of this kind of node: the dataset, then the reference's checks",
                f"{options.calibrate_runs} times (autograder/calibrate.py). The array starts after it succeeds."],
               ["--job-name=lab-calibrate", *options.resources(), f"--time={options.time}",
                f"--output={job / 'logs' / 'calibrate-%j.out'}"],
               [f"{shlex.quote(str(python))} -m labsupport data",
                shlex.join([*run, "calibrate", f"--runs={options.calibrate_runs}"])])
    last = len(students) - 1
    script("grade.sbatch",
           [origin, f"One student per array task (students.txt, line task id + 1), {len(students)} in all,",
            f"at most {options.max_running} at once, each on "
            + ("a whole node." if options.exclusive else "one whole GPU."),
            "Each grades exactly as `python -m autograder grade <student>` on that node would."],
           ["--job-name=lab-grade", f"--array=0-{last}%{options.max_running}", *options.resources(),
            f"--time={options.time}", f"--output={job / 'logs' / 'grade-%A_%a.out'}"],
           [f"student=$(sed -n \"$((SLURM_ARRAY_TASK_ID + 1))p\" {shlex.quote(str(job / 'students.txt'))})",
            "exec " + shlex.join([*run, "grade-task", f"--job={job}", *timeout]) + ' "$student"'])
    script("merge.sbatch",
           [origin, "After the array, whatever each task did: every task's grades into the gradebook,",
            "then the feedback, the CSVs and the class report (python -m autograder merge)."],
           ["--job-name=lab-merge", *[o for o in options.resources() if o.startswith("--partition")],
            "--time=01:00:00", f"--output={job / 'logs' / 'merge-%j.out'}"],
           ["exec " + shlex.join([*run, "merge", f"--job={job}"])])
    cap = options.max_running
    submit = [
        "#!/bin/bash",
        f"# {origin}",
        "# Submits the grading: " + ("the calibration, then " if calibrate else "")
        + "the array" + (" (afterok)" if calibrate else "") + ", then the merge (afterany).",
        "# With an argument, regrades only those array tasks (e.g. 3,7) and merges again:",
        "# `python -m autograder grade --backend slurm --rerun --submit` passes the failed and missing ones.",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        'jobid() { echo "${1%%;*}"; }  # sbatch --parsable prints "jobid[;cluster]"',
        'if [ $# -eq 0 ]; then',
        *(['  calibration=$(jobid "$(sbatch --parsable calibrate.sbatch)")',
           '  array=$(jobid "$(sbatch --parsable --dependency=afterok:$calibration grade.sbatch)")']
          if calibrate else ['  array=$(jobid "$(sbatch --parsable grade.sbatch)")']),
        'else',
        f'  array=$(jobid "$(sbatch --parsable --array="$1%{cap}" grade.sbatch)")',
        'fi',
        'merge=$(jobid "$(sbatch --parsable --dependency=afterany:$array merge.sbatch)")',
        'echo "calibration ${calibration:-none}, grading array $array, merge $merge"',
    ]
    (job / "submit.sh").write_text("\n".join(submit) + "\n")
    (job / "submit.sh").chmod(0o755)
    return job


def submit(job: Path, tasks: list[int] | None = None) -> str:
    """Run submit.sh (for ``tasks`` only, when given); returns what it printed."""
    if shutil.which("sbatch") is None:
        raise course.CourseError(f"sbatch is not on PATH: submit from a Slurm login node with "
                                 f"`bash {job / 'submit.sh'}`.")
    argv = ["bash", str(Path(job) / "submit.sh")] + ([",".join(map(str, tasks))] if tasks else [])
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise course.CourseError(f"submit.sh failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout.strip()
