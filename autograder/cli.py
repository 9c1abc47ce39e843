"""The command line of the instructor commands: ``python -m autograder <command>``.

One function per command; each calls its module (release, run, collect, grade, calibrate,
reports) with the course root, and prints. A CourseError prints its message and exits with 1.
The arguments each accepts: :mod:`.arguments`. The environment is read here, at the entry
point, and passed on as arguments (the Slurm scripts' exports, a task's GPUs and Slurm ids).
"""

from __future__ import annotations

import os
import sys

from .arguments import parser
from .course import REPO_ROOT, CourseError, shown
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
    if args.budget is not None:
        from labsupport.hardware import describe_machine

        from . import budget
        out = args.output or REPO_ROOT / "build" / f"first-run-{describe_machine().device_class}"
        path, wrong = budget.within_budget(args.budget, tuple(args.notebooks), args.course, out)
        print(path.read_text())
        print(f"wrote {shown(path)}")
        return 1 if wrong else 0
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


# Each subcommand of :func:`.arguments.parser`, by name, and the function that runs it.
COMMANDS = {"release": cmd_release, "collect": cmd_collect, "grade": cmd_grade, "grade-task": cmd_grade_task,
            "merge": cmd_merge, "calibrate": cmd_calibrate, "benchmark": cmd_benchmark, "accept": cmd_accept,
            "report": cmd_report, "run": cmd_run}


def main(argv: list[str] | None = None) -> int:
    """Run one instructor command; a CourseError prints its message and exits with 1. SIGINT and
    SIGTERM stop it cleanly (:mod:`.stopping`: what it started is ended) with 128 + the signal."""
    args = parser().parse_args(argv)
    try:
        with on_signals():
            return COMMANDS[args.command](args)
    except CourseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except Stopped as stop:
        print(f"stopped by {stop}: everything this command started has ended", file=sys.stderr)
        return stop.exit_code
