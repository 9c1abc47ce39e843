"""The command line of the instructor commands: ``python -m autograder <command>``.

One function per command; each calls its module (release, run, collect, grade, calibrate,
reports) with the course root, and prints. A CourseError prints its message and exits with 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .course import COURSE_ROOT, REPO_ROOT, CourseError, shown
from .stopping import Stopped, on_signals


def cmd_release(args) -> int:
    """``release``: setup cells, generate_assignment, copy to notebooks/."""
    from .release import release

    release(args.course, args.notebooks or args.course.resolve().parent / "notebooks",
            student_url=args.student_url, student_dir=args.student_dir)
    return 0


def cmd_run(args) -> int:
    """``run``: execute the reference notebooks, then print the ladder and where the report is."""
    import pandas as pd

    from labsupport import report
    from labsupport.hardware import describe_machine

    from . import reference
    from .run import run_reference

    path, misses = run_reference(args.course, args.build)
    lad = report.ladder(args.build.resolve() / "run" / "results",
                        assemble=reference.solutions("06").assemble_ladder)
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print("\nThe optimisation ladder on this machine:")
        print(lad.table.round(2).to_string(na_rep="-"))
        details = report.rung_details(lad)
        if not details.empty:
            print("\nEach rung's one change, and the spread of its throughput:")
            print(details[["builds on", "samples/s IQR", "step ms (median)", "change"]].round(1)
                  .to_string(na_rep="-", max_colwidth=70))
        print(f"(-: not measured. {report.LADDER_NOTE})")
        for line in report.phase_mismatches(lad):  # the report draws its shares on the timed step
            print("phases:", line)
        roof = report.roofline(lad, describe_machine().device)  # the peaks 06's report kept: one value
        if not roof.empty:
            print("\nHow close each rung runs to this machine's limit (FLOPs counted on the step; % of the "
                  "theoretical peak; the best kernel measured alone beside it; as in the report):")
            print(roof.drop(columns=["reading"]).round(1).to_string(na_rep="-"))
            for rung, why in roof["reading"].items():
                if why:
                    print(f"  {rung}: {why}")
    for line in lad.missing:
        print("missing:", line)
    if misses:
        machine = describe_machine()
        print(f"\nBars the reference missed on this machine ({machine.device_name}, class "
              f"{machine.device_class}), with what it measured; not a failure of the run:")
        for miss in misses:
            print(f"  {miss['notebook']}: {miss['message']}")
        print("A grading machine gets bars its reference clears: run `python -m autograder calibrate` "
              "there before grading (autograder/README.md).")
    else:
        print("\nThe reference cleared every graded bar on this machine.")
    print(f"\nReport: {path}")
    return 0



def cmd_collect(args) -> int:
    """``collect``: per-student folders or zips into submitted/; a line per student."""
    from . import collect

    found = collect.collect(args.inbox, args.course)
    collect.print_collected(found)
    return 0


def cmd_grade(args) -> int:
    """``grade``: autograde, feedback, CSV exports and the summary; or, with ``--backend slurm``,
    write (and with ``--submit`` submit) the class's Slurm job."""
    from . import grade

    if args.backend == "slurm":
        return _grade_on_slurm(args)
    if args.jobs > 1:
        from . import parallel, tasks

        if args.no_sandbox:
            raise CourseError("--no-sandbox is for debugging the grader on one submission, not with --jobs.")
        outcome = parallel.grade(args.course, args.student or None, args.jobs, timeout_s=args.timeout)
        again = f"python -m autograder grade --jobs {args.jobs} " + " ".join([*outcome["failed"], *outcome["missing"]])
        tasks.print_merge(outcome, args.course, parallel.job_dir(args.course), again=again)
        return 0
    try:
        grades = grade.grade(args.course, args.student or None, timeout_s=args.timeout,
                             sandboxed=not args.no_sandbox)
    except Stopped as stop:  # the CSVs are written, marked interrupted: show what was decided
        if stop.grades:
            grade.print_summary(stop.grades, args.course)
        raise
    grade.print_summary(grades, args.course)
    return 0


def _grade_on_slurm(args) -> int:
    from . import grade, slurm, tasks

    job = args.job or slurm.job_dir(args.course)
    if args.rerun:
        again = tasks.unfinished(job)
        if not again:
            print(f"every task of {shown(job)} has a result: nothing to grade again.")
            return 0
        names = tasks.students_of(job)
        print(f"{len(again)} task(s) to grade again: {', '.join(names[i] for i in again)}")
    else:
        if args.no_sandbox:
            raise CourseError("--no-sandbox is for debugging the grader locally, not for a class on a cluster.")
        students = grade.students_to_grade(args.course, args.student or None)
        options = slurm.Options(partition=args.partition, constraint=args.constraint, exclusive=args.exclusive,
                                max_running=args.max_running, cpus_per_task=args.cpus_per_task, time=args.time,
                                calibrate_runs=None if args.no_calibrate else args.calibrate_runs,
                                timeout_s=args.timeout, carried=slurm.carried(os.environ))
        job = slurm.write(args.course, students, options, job)
        again = None
        scripts = sorted(p.name for p in job.iterdir() if p.suffix in (".sh", ".sbatch"))
        print(f"wrote {shown(job)}: {', '.join(scripts)} ({len(students)} tasks)")
    if args.submit:
        print(slurm.submit(job, again))
        print(f"when the merge job ends: {shown(args.course)}/grades.csv; logs in {shown(job)}/logs/")
    else:
        rerun = f" {','.join(map(str, again))}" if again else ""
        print(f"submit with: bash {shown(job)}/submit.sh{rerun}   (or add --submit)")
    return 0


def cmd_grade_task(args) -> int:
    """``grade-task``: one grading task (Slurm's grade.sbatch and ``grade --jobs`` run it): one
    student, privately."""
    from . import tasks

    if args.cores:  # before torch is imported: it sizes its thread pool to the cores it may use
        os.sched_setaffinity(0, {int(c) for c in args.cores.split(",")})
    record = tasks.run_task(args.course, args.job, args.student, timeout_s=args.timeout,
                            gpus=os.environ.get("CUDA_VISIBLE_DEVICES"),
                            slurm={k: os.environ.get(k) for k in tasks.SLURM_IDS})
    print(f"{args.student}: {record['status']}" + (f" ({record['error']})" if record.get("error") else ""))
    return 0 if record["status"] == "graded" else 1


def cmd_merge(args) -> int:
    """``merge``: every task's grades into the gradebook; feedback, CSVs and the class report."""
    from . import slurm, tasks

    job = args.job or slurm.job_dir(args.course)
    outcome = tasks.merge(args.course, job)
    tasks.print_merge(outcome, args.course, job)
    return 0


def cmd_calibrate(args) -> int:
    """``calibrate``: run the reference's checks, write and print this machine's thresholds."""
    import pandas as pd

    from . import calibrate

    path, table = calibrate.calibrate(args.runs, args.course, args.output)
    with pd.option_context("display.width", 200, "display.max_colwidth", 70):
        print(table.to_string())
    print(f"\nwrote {shown(path)}: grading on this machine now uses the 'calibrated' column.")
    return 0


def cmd_benchmark(args) -> int:
    """``benchmark``: the reference's speed and memory checks, N runs, against the class defaults."""
    import pandas as pd

    from . import benchmark

    if args.grading:
        path, table = benchmark.grading_time(tuple(args.notebooks) or None, args.course, args.output)
        print(path.read_text())
    else:
        path, table = benchmark.benchmark(args.runs, args.course, args.output)
        with pd.option_context("display.width", 200):
            print(table.to_string(float_format=lambda v: f"{v:.3g}"))
    print(f"\nwrote {shown(path)}")
    return 0


def cmd_accept(args) -> int:
    """``accept``: is this machine's class ready to grade (autograder/accept.py)."""
    from . import accept

    if args.checks_of:  # the child process that runs one notebook's checks
        return accept.main_checks_of(args.checks_of, args.runs, args.course, args.json)
    path, wrong = accept.accept(tuple(args.parts.split(",")), args.runs, tuple(args.notebooks) or None,
                                args.course, args.output, args.limit, args.deadline)
    print(path.read_text())
    print(f"wrote {shown(path)}")
    return 1 if wrong else 0


def cmd_report(args) -> int:
    """``report``: one student's report, the reference's, or the class summary, as HTML."""
    from . import reports

    if args.reference:
        path = reports.reference_report(args.build, args.output)
    elif args.student:
        path = reports.student_report(args.course, args.student, args.output)
    else:
        path = reports.class_report(args.course, args.output)
    print(f"wrote {shown(path)}")
    return 0



def parser() -> argparse.ArgumentParser:
    """The ``python -m autograder`` argument parser, one subcommand per instructor command."""
    p = argparse.ArgumentParser(
        prog="python -m autograder",
        description="Instructor commands of the lab's nbgrader course (autograder/). "
                    "Run from the repository root. A typical term: release, then collect, "
                    "calibrate (once per grading machine), grade, report.")
    p.add_argument("--course", type=Path, default=COURSE_ROOT,
                   help="the course root with nbgrader_config.py and source/ (default: %(default)s)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
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
    rel.set_defaults(func=cmd_release)
    col = sub.add_parser(
        "collect", help="put a folder of per-student folders or zips into submitted/",
        description="INBOX holds one folder <student>/ or zip <student>.zip per student, with "
                    "the notebooks at any depth. Each is copied to submitted/<student>/lab/, "
                    "replacing an earlier submission. A bad zip, a missing, misnamed or "
                    "unreadable notebook is reported for that student; the rest are collected.")
    col.add_argument("inbox", type=Path, help="the folder of submissions")
    col.set_defaults(func=cmd_collect)
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
    gra.set_defaults(func=cmd_grade)
    task = sub.add_parser(
        "grade-task", help="(run by grade.sbatch) grade one student privately on this node, as a Slurm task",
        description="Grade STUDENT exactly as `grade` does, in a private copy of the course in TMPDIR, and "
                    "leave the result in JOB/tasks/STUDENT/ for `merge`. Exits 1 when grading failed.")
    task.add_argument("student")
    task.add_argument("--job", type=Path, required=True, help="the job folder")
    task.add_argument("--timeout", type=int, default=None, help="seconds a cell may run")
    task.add_argument("--cores", default=None, metavar="LIST",
                      help="the CPU cores to grade on, e.g. 0,1 (grade --jobs gives each task its own)")
    task.set_defaults(func=cmd_grade_task)
    mer = sub.add_parser(
        "merge", help="(run by merge.sbatch) merge the Slurm tasks' grades into the gradebook",
        description="Copy every task's gradebook entries into the course's gradebook (nbgrader's API), bring "
                    "back the graded notebooks and measurements, regenerate the feedback, the CSVs and the "
                    "class report, and name the tasks that failed or left no result.")
    mer.add_argument("--job", type=Path, default=None, help="the job folder (default: slurm/ in the course root)")
    mer.set_defaults(func=cmd_merge)
    cal = sub.add_parser(
        "calibrate", help="derive this machine's thresholds from the reference solution's runs",
        description="Run the reference solutions' speed and memory checks RUNS times on this "
                    "machine and write calibration.toml (the rule: autograder/calibrate.py). "
                    "Prints class defaults against calibrated thresholds.")
    cal.add_argument("--runs", type=int, default=3, help="runs of the reference (default: %(default)s)")
    cal.add_argument("--output", type=Path, default=None,
                     help="calibration file (default: LAB_CALIBRATION or calibration.toml in the course root)")
    cal.set_defaults(func=cmd_calibrate)
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
    ben.set_defaults(func=cmd_benchmark)
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
    acc.add_argument("--checks-of", default=None, help=argparse.SUPPRESS)
    acc.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    acc.add_argument("notebooks", nargs="*", metavar="NN", help="only these notebooks (default: every graded one)")
    acc.set_defaults(func=cmd_accept)
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
    rep.set_defaults(func=cmd_report)
    run = sub.add_parser(
        "run", help="execute the reference notebooks in order, export the report to HTML",
        description="Execute the masters (reference solutions) headless in order on this "
                    "machine's profile in BUILD/run, export the comparison report to "
                    "BUILD/report.html, and print the ladder. This is `make run`.")
    run.add_argument("--build", type=Path, default=COURSE_ROOT.parent / "build",
                     help="output folder (default: build/ in the repository)")
    run.set_defaults(func=cmd_run)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one instructor command; a CourseError prints its message and exits with 1. SIGINT and
    SIGTERM stop it cleanly (:mod:`.stopping`: what it started is ended) with 128 + the signal."""
    args = parser().parse_args(argv)
    try:
        with on_signals():
            return args.func(args)
    except CourseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except Stopped as stop:
        print(f"stopped by {stop}: everything this command started has ended", file=sys.stderr)
        return stop.exit_code
