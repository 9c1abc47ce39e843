"""``grade``: autograde every collected submission, generate feedback, export the grades as CSV.

The student's kernel runs the notebook; the grader decides the grade. Each student in
``submitted/`` (see collect.py), in name order, is graded by :func:`.submission.grade_student`:
each graded notebook run by nbgrader in the submission's sandbox, in lab order (01 ... 07), then
judged outside it (:mod:`.deciding`), the gradebook checked and the feedback generated.

A notebook whose cell runs past ``Execute.timeout`` (sized per device class below) is
interrupted by nbgrader, costs that cell, and is marked "timed out"; a notebook nbgrader cannot
process at all is marked "failed to run". A submission whose grading raised is marked "failed
to grade". None of them stops the batch, and the CSVs are written after every student
(:mod:`.gradebook`).

Stopped by SIGINT (Ctrl-C) or SIGTERM (Slurm, ``timeout``; :mod:`.stopping`), ``grade`` ends the
submission's sandboxes (its cgroup killed, its folders unmounted), records the notebooks the
grader had not decided as "not graded" (0 points, in the gradebook too: the kernel's own marks are
never a grade, see :class:`.autograding.WithheldAutoGrades`), writes the CSVs with every row marked
``interrupted``, and exits with 128 + the signal. ``grade`` run again with no student named grades
the submissions that batch did not finish, and keeps the rows of those it did.

Outputs in the course root: ``grades.csv`` (nbgrader's export, one row per student),
``grades_by_check.csv`` (one row per student and graded cell, with the judge's table),
``grading_summary.csv`` (one row per student and notebook: status, score, seconds, edited cells,
cells the kernel scored otherwise than the grader, gradebook repairs), ``verdicts/<student>/``
(the judge's decisions), ``results/<student>/`` (the grader's measurements),
``reports/<student>.html`` (the report the student's 06 exported), and, for a notebook that failed
to run, ``grading_logs/<student>/<notebook>.autograde.log``: nbgrader's whole log, its traceback
and the sandboxed kernel's own output (:func:`.gradebook.run`; the summary's error names it).

The modules behind it: :mod:`.submission` (one submission: folders, sandboxes, kernels, the
judge), :mod:`.gradebook` (nbgrader's apps, the gradebook, the CSVs), :mod:`.tasks` (a
submission graded as a task of its own, and the merge of tasks), :mod:`.parallel` and
:mod:`.slurm` (running tasks side by side).
"""

from __future__ import annotations

import traceback
from dataclasses import asdict, fields
from pathlib import Path

import pandas as pd

from . import course, gradebook, release, sandbox_memory, stopping
from .course import Course
from .submission import NOT_GRADED, Batch, NotebookGrade, grade_student  # noqa: F401 (NotebookGrade: the batch's rows)


def cell_timeout_s(device_class: str) -> int:
    """The per-cell time limit for grading on ``device_class`` (the device-class table in
    labsupport.hardware; nbgrader's Execute.timeout, the option its Execute preprocessor honours)."""
    from labsupport.hardware import CLASSES

    if device_class in CLASSES:
        return CLASSES[device_class].cell_timeout_s
    return max(c.cell_timeout_s for c in CLASSES.values())


def submitted_students(where: Course | Path) -> list[str]:
    """The students with a folder in ``submitted/`` (collect.py puts them there)."""
    folder = course.of(where).root / "submitted"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def refuse_root_without_sandbox(sandboxed: bool) -> None:
    """A CourseError where grading would run students' code as root: root, no sandbox to be had
    here (an old bubblewrap without ``--size``, no user namespaces, ...), and ``--no-sandbox``
    not given. Once, such a grader printed a warning and ran every notebook as root (issue 58)."""
    import os

    from . import sandbox

    why = sandbox.problem()
    if sandboxed and why and os.geteuid() == 0:
        raise course.CourseError(
            f"refusing to grade: there is no sandbox here ({why}), and as root the students' code would run "
            "as root. Install a bubblewrap that starts here (0.8 or newer, for --size: apt-get install "
            "bubblewrap), or pass --no-sandbox to grade without one on purpose (debugging the grader only).")


def grade(where: Course | Path = course.COURSE_ROOT, students: list[str] | None = None, *,
          timeout_s: int | None = None, budget_s: float | None = None,
          submission_budget_s: float | None = None, sandboxed: bool = True,
          progress: bool = True) -> list[NotebookGrade]:
    """Autograde, generate feedback and export grades for ``students`` (default: all collected).

    The gradebook must know the release: run ``python -m autograder release`` first (grade does
    it when the gradebook is missing). ``timeout_s`` is the per-cell limit (default: the device
    class's), ``budget_s`` a notebook's wall clock (default: NOTEBOOK_BUDGET_CELLS cell limits),
    ``submission_budget_s`` all of a submission's (default: SUBMISSION_BUDGET_CELLS cell limits);
    ``sandboxed=False`` grades without the sandbox (debugging the grader only).
    Returns one NotebookGrade per student and notebook.
    """
    from tqdm.auto import tqdm

    from labsupport.hardware import describe_machine

    the = course.of(where)
    refuse_root_without_sandbox(sandboxed)
    carried = []  # an interrupted batch's finished submissions, when this one finishes it
    if students is None:
        carried, students = resumed(the)
        if carried and not students:
            gradebook.export_quietly(the, carried)
            return carried
    students = students_to_grade(the, students)
    machine = describe_machine()
    timeout_s = timeout_s or cell_timeout_s(machine.device_class)
    batch = Batch.prepare(the, timeout_s)
    if budget_s:
        batch.notebook_budget_s = budget_s
    if submission_budget_s:
        batch.submission_budget_s = submission_budget_s
    if not sandboxed:
        batch.box = batch.memory = "--no-sandbox was given"
    print(f"grading {len(students)} submission(s) on {machine.device_name} ({machine.device_class}), "
          f"{timeout_s} s per cell at most, {batch.notebook_budget_s:.0f} s per notebook, "
          f"{batch.submission_budget_s:.0f} s per submission, "
          + ("each in its own sandbox (bubblewrap)" if batch.box is None else
             f"WITHOUT a sandbox: {batch.box}. Students' code then runs with the grader's rights: "
             "grade as root with bubblewrap installed (apt-get install bubblewrap)"))
    if batch.box is None:
        print(f"memory: {sandbox_memory.memory_bytes() / 2**30:.1f} GiB per sandbox" if batch.memory is None else
              f"note: NO memory limit per sandbox ({batch.memory}); only the address-space limit applies")
    from labsupport.grading import cgroups

    if cgroups.problem():  # the judge freezes one worker's cgroup while it times the other: none, no speed
        print(f"note: NO speed comparing a student's code with the baseline is graded ({cgroups.problem()}): "
              "the judge cannot freeze one side while it times the other, so those checks fail \"not measured\"")
    if carried:
        print(f"finishing an interrupted batch: {len({g.student for g in carried})} submission(s) graded in it "
              f"are kept; grading the {len(students)} it did not finish")
    grades, stop = [], None
    bar = tqdm(students, desc="grading", unit="student", disable=not progress)
    with stopping.on_signals():
        try:
            for student in bar:
                bar.set_postfix_str(student)
                try:
                    made = grade_student(the, student, timeout_s=timeout_s, batch=batch)
                except Exception as err:  # one submission's failure never stops the batch
                    frame = traceback.extract_tb(err.__traceback__)[-1]
                    made = [NotebookGrade(student, "", "failed to grade", 0.0, 0.0, errors=[
                        f"{type(err).__name__}: {str(err)[:300]} ({Path(frame.filename).name}:{frame.lineno})"])]
                grades += made
                for g in made:
                    tqdm.write(notebook_line(g))
                gradebook.export_quietly(the, carried + grades)  # each student's grades are written as they are made
        except stopping.Stopped as err:
            stop = err
            grades += err.grades
            reached = {g.student for g in grades}
            grades += [NotebookGrade(s, "", NOT_GRADED, 0.0, 0.0, errors=[
                f"not graded: the batch was stopped ({err}) before this submission (the gradebook keeps "
                "whatever an earlier grading gave it)"]) for s in students if s not in reached]
            for g in grades:
                g.interrupted = True
        finally:
            gradebook.export_quietly(the, carried + grades)
    if stop is not None:
        stop.grades = carried + grades
        raise stop
    return carried + grades


def notebook_line(g: NotebookGrade) -> str:
    """One notebook's grading in a line: status, score, its time and its sandboxes' peak memory."""
    memory = "-" if g.peak_bytes is None else f"{g.peak_bytes / 2**30:.2f} GiB"
    return (f"{g.student} {g.notebook or '(submission)'}: {g.status}, {g.score:g}/{g.max_score:g} points, "
            f"{g.wall_s:.0f} s (kernel {g.seconds:.0f} s, verdict {g.verdict_s:.0f} s), peak memory {memory}")


def resumed(where: Course | Path) -> tuple[list[NotebookGrade], list[str] | None]:
    """After a batch that was stopped (its ``grading_summary.csv`` marked ``interrupted``): the rows
    of the submissions it graded in full, and the students it did not finish (to grade now).
    Otherwise ``([], None)``: every collected submission is graded."""
    path = course.of(where).root / "grading_summary.csv"
    try:
        frame = pd.read_csv(path, keep_default_na=False)
    except (OSError, ValueError):
        return [], None
    if frame.empty or "interrupted" not in frame or not frame.interrupted.astype(str).eq("True").any():
        return [], None
    unfinished = set(frame.loc[frame.status.isin([NOT_GRADED, "failed to grade"]), "student"].astype(str))
    kinds = {f.name: f.type for f in fields(NotebookGrade)}
    carried = []
    for row in frame.to_dict("records"):
        if str(row["student"]) in unfinished:
            continue
        values = {}
        for name, kind in kinds.items():
            value = row.get(name, "")
            if "list" in str(kind):
                value = [v for v in str(value).split(" | ") if v]
            elif name in ("needs_manual", "interrupted"):
                value = str(value) == "True"
            elif name == "peak_bytes":
                value = int(float(value)) if str(value) not in ("", "nan") else None
            elif "float" in str(kind):
                value = float(value or 0.0)
            else:
                value = str(value)
            values[name] = value
        values["interrupted"] = False  # graded in full: its notebooks were all decided
        carried.append(NotebookGrade(**values))
    students = sorted(s for s in submitted_students(where) if s in unfinished or s not in set(frame.student.astype(str)))
    return carried, students


def students_to_grade(where: Course | Path, students: list[str] | None = None) -> list[str]:
    """``students`` (default: every collected one), each checked to have a submission; makes sure
    the gradebook holds the release, which autograde checks notebooks against."""
    the = course.of(where)
    students = students if students is not None else submitted_students(the)
    for student in students:
        course.check_student_id(student)
    if not students:
        raise course.CourseError(f"No submissions in {the.root / 'submitted'}: run "
                                 "`python -m autograder collect <folder>` first.")
    unknown = [s for s in students if not (the.root / "submitted" / s).is_dir()]
    if unknown:
        raise course.CourseError(f"No submission for {', '.join(unknown)} in {the.root / 'submitted'}.")
    if not the.gradebook_path.exists():
        release.generate(the.root)
    return students



def summary(grades: list[NotebookGrade]) -> pd.DataFrame:
    """One row per student: score, max (all points), automatic max (the grader's), checks held for
    review, and which notebooks timed out, failed or were missing."""
    frame = pd.DataFrame([asdict(g) for g in grades])
    rows = []
    for student, group in frame.groupby("student", sort=True):
        def named(status):
            return ", ".join(n or "(every notebook)" for n in group.loc[group.status == status, "notebook"])
        rows.append({"student": student, "score": group.score.sum(), "max": group.max_score.sum(),
                     # what the grader decides; the rest (06's written analysis) is a person's to give
                     "automatic max": group.auto_max_score.sum(),
                     "for review": "; ".join(f"{n}: {r}" for n, rs in zip(group.notebook, group.review) for r in rs),
                     "timed out": named("timed out"), "failed to run": named("failed to run"),
                     "missing": named("missing"), "not graded": named(NOT_GRADED),
                     "edited read-only cells": "; ".join(f"{n}: {', '.join(c)}" for n, c in
                                                         zip(group.notebook, group.edited_cells) if c),
                     "gradebook repaired": "; ".join(r for rs in group.repaired for r in rs),
                     "failed to grade": named("failed to grade"),
                     "needs manual grading": ", ".join(group.loc[group.needs_manual, "notebook"])})
    return pd.DataFrame(rows).set_index("student")


def print_summary(grades: list[NotebookGrade], where: Course | Path) -> None:
    """The end-of-grading summary: per student, then counts (graded, failed to run, timed out)."""
    table = summary(grades)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        print(table.to_string())
    statuses = pd.Series([g.status for g in grades])
    per_student = {s: {g.status for g in grades if g.student == s} for s in table.index}
    print(f"\n{len(per_student)} submission(s): "
          f"{sum(st <= {'graded'} for st in per_student.values())} graded in full, "
          f"{sum('failed to run' in st for st in per_student.values())} with a notebook that failed to run, "
          f"{sum('timed out' in st for st in per_student.values())} with a notebook that timed out, "
          f"{sum('missing' in st for st in per_student.values())} with a missing notebook "
          f"({int((statuses == 'graded').sum())} of {len(statuses)} notebooks graded normally).")
    if any(g.interrupted for g in grades):
        print(f"\nINTERRUPTED: the batch was stopped; {sum(g.status == NOT_GRADED for g in grades)} notebook(s) or "
              "submission(s) were not graded (0 points, marked 'not graded' and 'interrupted' in grading_summary.csv). "
              "`python -m autograder grade` grades them, keeping the rest.")
    held = [(g.student, r) for g in grades for r in g.review]
    if held:
        print(f"\n{len(held)} check(s) held for review, 0 points until you decide (a manual score in "
              "nbgrader's formgrader gives them):")
        for student, why in held:
            print(f"  {student}: {why}")
    root = course.shown(course.of(where).root)
    if any(g.status == "failed to run" for g in grades):
        print(f"why a notebook failed to run: {root}/{gradebook.LOGS}/<student>/<notebook>.autograde.log")
    print(f"grades: {root}/grades.csv, per check: {root}/grades_by_check.csv, "
          f"summary: {root}/grading_summary.csv, feedback: {root}/feedback/<student>/, "
          f"the grader's verdicts: {root}/verdicts/<student>/")
