"""What ``python -m autograder`` accepts: the argument parser, one subcommand per instructor command.

What each command does is in :mod:`.cli` (``cli.COMMANDS``, by the subcommand's name, which the
parser leaves in ``args.command``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .course import COURSE_ROOT, REPO_ROOT


def parser() -> argparse.ArgumentParser:
    """The ``python -m autograder`` argument parser, one subcommand per instructor command."""
    p = argparse.ArgumentParser(
        prog="python -m autograder",
        description="Instructor commands of the lab's nbgrader course (autograder/). "
                    "Run from the repository root. A typical term: release, then collect, "
                    "calibrate (once per grading machine), grade, report.")
    p.add_argument("--course", type=Path, default=COURSE_ROOT,
                   help="the course root with nbgrader_config.py and source/ (default: %(default)s)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")  # cli.COMMANDS runs it
    rel = sub.add_parser(
        "release", help="generate the student notebooks from the masters into notebooks/",
        description="Write autograder/setup_cell.py into the first code cell of every master in "
                    "source/lab/, run nbgrader generate_assignment --force (updating "
                    "gradebook.db and release/), and copy the student versions, outputs "
                    "cleared, into notebooks/. Commit the masters and notebooks/ afterwards.")
    rel.add_argument("--notebooks", type=Path, default=None,
                     help="where the student notebooks go (default: notebooks/ beside the "
                          "course root, i.e. the repository's notebooks/)")
    rel.add_argument("--student-url", default=None, metavar="URL",
                     help="where Colab's setup cell installs the student distribution from (a git "
                          "repository, zip or wheel URL); written into setup_cell.py and kept")
    rel.add_argument("--student-dir", type=Path, default=REPO_ROOT / "build" / "student",
                     help="where the student distribution is written (default: %(default)s, and "
                          "its zip beside it)")
    col = sub.add_parser(
        "collect", help="put a folder of per-student folders or zips into submitted/",
        description="INBOX holds one folder <student>/ or zip <student>.zip per student, with "
                    "the notebooks at any depth. Each is copied to submitted/<student>/lab/, "
                    "replacing an earlier submission. A bad zip, a missing, misnamed or "
                    "unreadable notebook is reported for that student; the rest are collected.")
    col.add_argument("inbox", type=Path, help="the folder of submissions")
    gra = sub.add_parser(
        "grade", help="autograde, generate feedback, export grades as CSV",
        description="Autograde each collected submission, its notebooks one at a time in lab "
                    "order in one folder (06 reads what 01-05 measured here), then generate "
                    "feedback/ and write grades.csv, grades_by_check.csv and "
                    "grading_summary.csv in the course root. Uses calibration.toml when it was "
                    "measured on this machine.")
    gra.add_argument("student", nargs="*", help="students to grade (default: all in submitted/)")
    gra.add_argument("--timeout", type=int, default=None,
                     help="seconds a cell may run (default: per device class, labsupport/hardware.py's CLASSES)")
    gra.add_argument("--no-sandbox", action="store_true",
                     help="run students' notebooks without the sandbox (autograder/sandbox.py): for "
                          "debugging the grader only, since their code then runs with your rights")
    gra.add_argument("--backend", choices=("local", "slurm"), default="local",
                     help="local: grade here, one submission after another (default); slurm: write a "
                          "job folder (autograder/slurm.py) that grades one submission per array task")
    gra.add_argument("--jobs", type=int, default=1, metavar="N",
                     help="local: grade N submissions at once, each on its own share of the cores and its own "
                          "GPU, where there are GPUs (autograder/parallel.py; default: %(default)s)")
    on = gra.add_argument_group("--backend slurm", "Where and how the array runs (see autograder/README.md).")
    on.add_argument("--submit", action="store_true", help="submit the job (bash <job>/submit.sh); without it, "
                                                          "only write it, to read and edit first")
    on.add_argument("--rerun", action="store_true",
                    help="grade again only the tasks that failed or left no result, then merge")
    on.add_argument("--job", type=Path, default=None, help="the job folder (default: slurm/ in the course root)")
    on.add_argument("--partition", default=None, help="the partition every task runs in")
    on.add_argument("--constraint", default=None, help="a node feature every task needs (one GPU type)")
    on.add_argument("--exclusive", action="store_true",
                    help="a whole node per task (default: one whole GPU per task, --gres=gpu:1)")
    on.add_argument("--max-running", type=int, default=8, help="tasks at once (default: %(default)s)")
    on.add_argument("--cpus-per-task", type=int, default=None,
                    help="CPUs each task gets beside its GPU (default: the partition's); the same for all")
    on.add_argument("--time", default="03:00:00", help="Slurm time limit per task (default: %(default)s)")
    on.add_argument("--calibrate-runs", type=int, default=3,
                    help="runs of the calibration job that precedes the array (default: %(default)s)")
    on.add_argument("--no-calibrate", action="store_true",
                    help="submit no calibration job: keep the course's calibration.toml")
    task = sub.add_parser(
        "grade-task", help="(run by grade.sbatch) grade one student privately on this node, as a Slurm task",
        description="Grade STUDENT exactly as `grade` does, in a private copy of the course in TMPDIR, and "
                    "leave the result in JOB/tasks/STUDENT/ for `merge`. Exits 1 when grading failed.")
    task.add_argument("student")
    task.add_argument("--job", type=Path, required=True, help="the job folder")
    task.add_argument("--timeout", type=int, default=None, help="seconds a cell may run")
    task.add_argument("--cores", default=None, metavar="LIST",
                      help="the CPU cores to grade on, e.g. 0,1 (grade --jobs gives each task its own)")
    mer = sub.add_parser(
        "merge", help="(run by merge.sbatch) merge the Slurm tasks' grades into the gradebook",
        description="Copy every task's gradebook entries into the course's gradebook (nbgrader's API), bring "
                    "back the graded notebooks and measurements, regenerate the feedback, the CSVs and the "
                    "class report, and name the tasks that failed or left no result.")
    mer.add_argument("--job", type=Path, default=None, help="the job folder (default: slurm/ in the course root)")
    cal = sub.add_parser(
        "calibrate", help="derive this machine's thresholds from the reference solution's runs",
        description="Run the reference solutions' speed and memory checks RUNS times on this "
                    "machine and write calibration.toml (the rule: autograder/calibrate.py). "
                    "Prints class defaults against calibrated thresholds.")
    cal.add_argument("--runs", type=int, default=3, help="runs of the reference (default: %(default)s)")
    cal.add_argument("--output", type=Path, default=None,
                     help="calibration file (default: LAB_CALIBRATION or calibration.toml in the course root)")
    ben = sub.add_parser(
        "benchmark", help="measure the reference's speed and memory checks N times on this machine",
        description="Run the reference solutions' speed and memory checks RUNS times (as calibrate "
                    "does) and print each check's median, spread, class-default bar and margin; "
                    "the table also goes to build/benchmark-<class>.txt. Writes no calibration.")
    ben.add_argument("--runs", type=int, default=5, help="runs of the reference (default: %(default)s)")
    ben.add_argument("--output", type=Path, default=None, help="where the table goes")
    ben.add_argument("--grading", action="store_true",
                     help="instead, grade the reference submission in a temporary course (as `grade` does, "
                          "in its sandbox) and print the time per notebook: kernel, verdict process, the rest; "
                          "build/grading-time-<class>.txt")
    ben.add_argument("notebooks", nargs="*", metavar="NN",
                     help="with --grading, only these notebooks (e.g. 02); default: all graded ones")
    acc = sub.add_parser(
        "accept", help="is this machine's class ready to grade: the reference's checks, calibrated and graded",
        description="Run every graded check on the reference (each notebook in its own process), then calibrate "
                    "and grade the reference submission with those bars; write build/accept-<class>/accept.md, "
                    "ending with the verdict (exit 1 where the class is not ready).")
    acc.add_argument("--parts", default="checks,grade",
                     help="which parts, comma-separated (default: %(default)s)")
    acc.add_argument("--runs", type=int, default=3, help="runs of the reference's checks (default: %(default)s)")
    acc.add_argument("--limit", type=float, default=1800, help="seconds one notebook's checks may take")
    acc.add_argument("--deadline", type=float, default=None,
                     help="seconds all the checks may take together: a notebook still running then is stopped, and later ones are not started")
    acc.add_argument("--output", type=Path, default=None, help="folder for the tables (default: build/accept-<class>)")
    acc.add_argument("--budget", type=float, default=None, metavar="S",
                     help="instead, the first run on a new machine within S seconds (540 fits a 10-minute "
                          "GPU session): the reference graded as a student against the class defaults, then "
                          "the reference notebooks in the time left; stops at S, saying what it did not reach")
    acc.add_argument("--checks-of", default=None, help=argparse.SUPPRESS)
    acc.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    acc.add_argument("notebooks", nargs="*", metavar="NN", help="only these notebooks (default: every graded one)")
    rep = sub.add_parser(
        "report", help="export a student's or the reference's report, or the class summary, as HTML",
        description="With --student, that student's comparison report from their grading-time "
                    "results (reports/<student>.html); with --reference, the report of `make "
                    "run` (build/report.html); with neither, the class summary (reports/class.html).")
    who = rep.add_mutually_exclusive_group()
    who.add_argument("--student", help="the student whose report to export")
    who.add_argument("--reference", action="store_true", help="the reference run's report")
    rep.add_argument("--build", type=Path, default=COURSE_ROOT.parent / "build",
                     help="make run's output folder, for --reference (default: build/)")
    rep.add_argument("--output", type=Path, default=None, help="where to write the HTML")
    run = sub.add_parser(
        "run", help="execute the reference notebooks in order, export the report to HTML",
        description="Execute the masters (reference solutions) headless in order on this "
                    "machine's profile in BUILD/run, export the comparison report to "
                    "BUILD/report.html, and print the ladder. This is `make run`.")
    run.add_argument("--build", type=Path, default=COURSE_ROOT.parent / "build",
                     help="output folder (default: build/ in the repository)")
    return p
