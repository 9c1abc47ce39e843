"""Instructor commands of the lab's nbgrader course: ``python -m autograder <command>``.

- ``release``: write the setup cell (``setup_cell.py``) into every master, run nbgrader
  generate_assignment, and copy the student versions into ``notebooks/`` with outputs cleared.
- ``collect`` (collect.py): a folder of per-student folders or zips into ``submitted/``.
- ``grade`` (grade.py): autograde in lab order, feedback, grades as CSV, a summary.
- ``calibrate`` (calibrate.py): this machine's thresholds from the reference's runs.
- ``report`` (reports.py): a student's or the reference's report, or the class summary, as HTML.
- ``run``: execute the reference notebooks and export the report (``make run``).

Every function takes the course root (the folder holding ``nbgrader_config.py`` and
``source/``) and the notebooks folder as arguments, so tests can run them on a temporary copy
of the course and never touch the real release or gradebook.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

COURSE_ROOT = Path(__file__).resolve().parent  # autograder/
NOTEBOOKS_DIR = COURSE_ROOT.parent / "notebooks"  # the committed student versions
SETUP_TEMPLATE = COURSE_ROOT / "setup_cell.py"  # the first code cell of every notebook
CONFIG_NAME = "nbgrader_config.py"
SETUP_GRADE_ID = "setup"  # nbgrader grade_id of every master's first code cell


class CourseError(RuntimeError):
    """A course command cannot go on; the message says what to fix or run."""


# Targets the reference solution does not reach on a device class, measured and reported rather
# than hidden: the check stays at the bar and fails there on the class defaults, and
# `make run` and the master-validation test let exactly these failures through, as a warning that
# quotes the measurement. (The calibrate command derives a grading machine's bar from what the
# reference achieves there; see thresholds.toml.) A key is a device class, or a class and the CPU's
# bf16 units ("cpu-bf16/avx512_bf16": such CPUs only). Remove an entry once the reference meets it.
KNOWN_SHORTFALLS = {
    "cpu-bf16": {
        # bf16 + channels_last + the fast loader, end to end, paired against the naive baseline:
        # 1.70-1.92x across runs with AMX. A larger batch adds ~7% per sample; compile and
        # checkpointing do not speed up CPU training (05, 04). The bar is 2.0x.
        "06-end-to-end",
    },
    "cpu-bf16/avx512_bf16": {
        # AVX-512 BF16 without AMX (AMD EPYC, 2 cores, 2026-11-23): checkpointing measured 0.421
        # more time per step (bar 0.40; 0.35-0.39 with AMX), and compiled bf16 inference 1.18x
        # eager (IQR 1.17-1.18; bar 1.25; 1.65-1.76x with AMX).
        "04-time-overhead",
        "05-compile-speedup",
    },
}


def calibration_file(course_root: Path) -> Path:
    """The course's calibration file: ``LAB_CALIBRATION``, else ``calibration.toml`` in the course
    root. calibrate writes it and grade hands it to the notebooks it runs (Used by: both)."""
    return Path(os.environ.get("LAB_CALIBRATION") or Path(course_root) / "calibration.toml")


def known_shortfall(test_source: str, machine) -> str | None:
    """The check id of a known shortfall on ``machine`` (a labsupport Machine) that a graded test
    cell asserts, or None."""
    keys = (machine.device_class, f"{machine.device_class}/{machine.cpu_bf16_units}")
    known = set().union(*(KNOWN_SHORTFALLS.get(k, set()) for k in keys))
    return next((check for check in sorted(known) if f'graded["{check}"]' in test_source), None)


# --- configuration and notebooks --------------------------------------------------------------

def load_config(course_root: Path = COURSE_ROOT):
    """The traitlets Config of ``course_root/nbgrader_config.py``, rooted at ``course_root``."""
    from traitlets.config.loader import PyFileConfigLoader

    path = Path(course_root) / CONFIG_NAME
    if not path.exists():
        raise CourseError(f"{path} does not exist: the course root must hold nbgrader's config.")
    cfg = PyFileConfigLoader(CONFIG_NAME, path=str(path.parent)).load_config()
    # The config computes its root from __file__; pin it anyway, so that a command pointed at a
    # temporary copy of the course can never write into the real one.
    cfg.CourseDirectory.root = str(Path(course_root).resolve())
    return cfg


def assignment_id(course_root: Path = COURSE_ROOT) -> str:
    """The course's one assignment id (``ASSIGNMENT`` in nbgrader_config.py)."""
    value = load_config(course_root).CourseDirectory.get("assignment_id", "")
    if not value:
        raise CourseError(f"{Path(course_root) / CONFIG_NAME} sets no CourseDirectory.assignment_id.")
    return value


def source_dir(course_root: Path = COURSE_ROOT) -> Path:
    """The folder of the masters and their files: ``source/`` in the course root."""
    cfg = load_config(course_root)
    return Path(course_root) / cfg.CourseDirectory.get("source_directory", "source")


def masters_dir(course_root: Path = COURSE_ROOT) -> Path:
    """The folder of the master notebooks: ``source/<assignment>/``."""
    return source_dir(course_root) / assignment_id(course_root)


def masters(course_root: Path = COURSE_ROOT) -> list[Path]:
    """The master notebooks, ``source/<assignment>/*.ipynb``, in name order (nbgrader's order)."""
    return sorted(masters_dir(course_root).glob("*.ipynb"))


def setup_cell_source(template: Path = SETUP_TEMPLATE) -> str:
    """The setup cell's source: the template file's text without its trailing newline."""
    return Path(template).read_text().rstrip("\n")


def first_code_cell(nb) -> nbformat.NotebookNode | None:
    """The first code cell of a notebook, or None if it has none."""
    return next((cell for cell in nb.cells if cell.cell_type == "code"), None)


def _setup_cell_metadata_problem(cell, name: str) -> str | None:
    meta = cell.metadata.get("nbgrader", {})
    if meta.get("grade_id") == SETUP_GRADE_ID and meta.get("locked"):
        return None
    return (f"{name}: the first code cell must be the setup cell, a read-only nbgrader cell with "
            f"grade_id {SETUP_GRADE_ID!r} and locked true (it has grade_id "
            f"{meta.get('grade_id')!r}, locked {meta.get('locked')!r}); fix it in the master")


def setup_cell_problems(nb, name: str, template: Path = SETUP_TEMPLATE) -> list[str]:
    """Why a master's first code cell is not the locked setup cell from the template (or [])."""
    cell = first_code_cell(nb)
    if cell is None:
        return [f"{name}: has no code cell; its first code cell must be the setup cell"]
    problems = [_setup_cell_metadata_problem(cell, name)]
    if cell.source != setup_cell_source(template):
        problems.append(f"{name}: the setup cell differs from {Path(template).name}")
    return [p for p in problems if p]


def graded_test_cells(nb) -> list[nbformat.NotebookNode]:
    """The autograded test cells of a notebook: code cells with nbgrader grade true."""
    return [cell for cell in nb.cells
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade")
            and not cell.metadata["nbgrader"].get("solution")]


def uncleared_cells(nb) -> list[int]:
    """Indices of code cells that still hold outputs or an execution count."""
    return [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            and (cell.get("outputs") or cell.get("execution_count") is not None)]


@contextlib.contextmanager
def _venv_on_path():
    """Put this interpreter's bin folder first on PATH while nbgrader runs.

    nbgrader's Gradebook runs the ``alembic`` executable by bare name (nbgrader/api.py,
    get_alembic_version), so ``.venv/bin/python -m autograder`` without an activated venv
    fails with FileNotFoundError: 'alembic'.
    """
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), old])
    try:
        yield
    finally:
        os.environ["PATH"] = old


# --- release ----------------------------------------------------------------------------------

def sync_setup_cells(course_root: Path = COURSE_ROOT, template: Path = SETUP_TEMPLATE) -> list[Path]:
    """Write the template into every master's setup cell; return the masters that changed.

    Only the cell's source is replaced (its nbgrader metadata stays); a master is rewritten
    only when its setup cell differs, so unchanged masters keep their bytes.
    """
    source = setup_cell_source(template)
    changed = []
    for path in masters(course_root):
        nb = nbformat.read(path, as_version=4)
        cell = first_code_cell(nb)
        problem = (f"{path.name}: has no code cell; its first code cell must be the setup cell"
                   if cell is None else _setup_cell_metadata_problem(cell, path.name))
        if problem:
            raise CourseError(problem)
        if cell.source != source:
            cell.source = source
            nbformat.write(nb, path)
            changed.append(path)
    return changed


def generate(course_root: Path = COURSE_ROOT) -> Path:
    """Run nbgrader generate_assignment --force in ``course_root``; return the release folder.

    Updates the gradebook there (``course_root/gradebook.db``): autograde needs its record of
    the masters' grade and locked cells.
    """
    from nbgrader.converters import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.utils import capture_log

    if not masters(course_root):
        raise CourseError(f"No master notebooks (*.ipynb) in "
                          f"{masters_dir(course_root)}.")
    cfg = load_config(course_root)
    coursedir = CourseDirectory(config=cfg)
    app = GenerateAssignment(coursedir=coursedir, config=cfg)
    app.force = True
    app.create_assignment = True
    with _venv_on_path():
        result = capture_log(app)
    if not result["success"]:
        raise CourseError("nbgrader generate_assignment failed:\n"
                          + result.get("log", "") + result.get("error", ""))
    return Path(coursedir.format_path(coursedir.release_directory, ".", coursedir.assignment_id))


def copy_release(release_dir: Path, notebooks_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    """Copy the release's notebooks into ``notebooks_dir``; return the paths written.

    Refuses a release with outputs left in a code cell. Notebooks in ``notebooks_dir`` that the
    release no longer has are removed: that folder holds generated files only.
    """
    released = sorted(Path(release_dir).glob("*.ipynb"))
    if not released:
        raise CourseError(f"The release folder {release_dir} holds no notebooks.")
    for path in released:
        dirty = uncleared_cells(nbformat.read(path, as_version=4))
        if dirty:
            raise CourseError(f"{path}: code cells {dirty} still have outputs or execution counts "
                              "after generate_assignment; nothing was copied.")
    notebooks_dir = Path(notebooks_dir)
    notebooks_dir.mkdir(parents=True, exist_ok=True)
    names = {path.name for path in released}
    for stale in sorted(notebooks_dir.glob("*.ipynb")):
        if stale.name not in names:
            stale.unlink()
            print(f"removed {stale} (no master of that name)")
    written = []
    for path in released:
        target = notebooks_dir / path.name
        shutil.copyfile(path, target)  # the bytes nbgrader wrote; not its read-only mode
        written.append(target)
    return written


def describe(path: Path) -> str:
    """One line about a student notebook: cells, graded test cells, points."""
    nb = nbformat.read(path, as_version=4)
    tests = graded_test_cells(nb)
    points = sum(float(cell.metadata["nbgrader"].get("points", 0)) for cell in tests)
    return f"{len(nb.cells)} cells, {len(tests)} graded test cells, {points:g} points"


def release(course_root: Path = COURSE_ROOT, notebooks_dir: Path = NOTEBOOKS_DIR,
            template: Path = SETUP_TEMPLATE) -> list[Path]:
    """Sync the setup cells, generate the student versions, copy them to ``notebooks_dir``."""
    for path in sync_setup_cells(course_root, template):
        print(f"updated the setup cell of {_shown(path)} from {Path(template).name}")
    written = copy_release(generate(course_root), notebooks_dir)
    for path in written:
        print(f"wrote {_shown(path)} ({describe(path)})")
    return written


# --- checks used by tests/test_course.py ------------------------------------------------------

def validate(notebook: Path, *, invert: bool = False, course_root: Path = COURSE_ROOT) -> dict:
    """Run ``nbgrader validate [--invert]`` on one notebook in this process; return its findings.

    The result is nbgrader's Validator.validate() dict: empty when validation succeeded, else
    ``failed`` (grade cells that failed), with ``invert`` ``passed`` (grade cells that passed),
    ``changed`` (locked cells whose checksum changed) or ``type_changed``. The notebook runs in
    its own folder with the course's Execute.timeout. (The ``nbgrader validate`` command only
    prints these and exits with 0 either way, so it cannot gate a test by its exit status.)
    """
    from nbgrader.validator import Validator

    cfg = load_config(course_root)
    cfg.Validator.invert = invert
    with _venv_on_path():
        return Validator(config=cfg).validate(str(notebook))


def _first_line_difference(expected: str, actual: str) -> str:
    """Where two cell sources first differ, for a one-line report."""
    for i, (a, b) in enumerate(zip(expected.splitlines(), actual.splitlines()), start=1):
        if a != b:
            return f"at line {i}: fresh {a.strip()[:60]!r}, committed {b.strip()[:60]!r}"
    n_exp, n_act = len(expected.splitlines()), len(actual.splitlines())
    return f"in length: fresh {n_exp} lines, committed {n_act}"


def notebook_differences(fresh, committed, name: str, limit: int = 10) -> list[str]:
    """How a committed student notebook differs from a fresh release: types, sources, metadata."""
    diffs = []
    if len(fresh.cells) != len(committed.cells):
        diffs.append(f"{name}: {len(committed.cells)} cells, the fresh release has {len(fresh.cells)}")
    for i, (a, b) in enumerate(zip(fresh.cells, committed.cells)):
        where = f"{name} cell {i}"
        grade_id = a.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id:
            where += f" ({grade_id})"
        if a.cell_type != b.cell_type:
            diffs.append(f"{where}: committed {b.cell_type} cell, fresh {a.cell_type} cell")
        if a.source != b.source:
            diffs.append(f"{where}: source differs {_first_line_difference(a.source, b.source)}")
        meta_a, meta_b = a.metadata.get("nbgrader", {}), b.metadata.get("nbgrader", {})
        if meta_a != meta_b:
            keys = sorted(k for k in set(meta_a) | set(meta_b) if meta_a.get(k) != meta_b.get(k))
            diffs.append(f"{where}: nbgrader metadata differs in {', '.join(keys)}")
        if len(diffs) >= limit:
            diffs.append(f"{name}: (further differences not listed)")
            break
    return diffs


def student_version_differences(course_root: Path = COURSE_ROOT,
                                notebooks_dir: Path = NOTEBOOKS_DIR) -> list[str]:
    """How ``notebooks_dir`` differs from a fresh release of the masters ([] if it matches).

    The release is generated in a temporary copy of the course (config and source only), so
    the real release folder and gradebook are never touched.
    """
    course_root, notebooks_dir = Path(course_root), Path(notebooks_dir)
    with tempfile.TemporaryDirectory(prefix="lab-course-") as tmp:
        copy = Path(tmp) / "course"
        copy.mkdir()
        shutil.copyfile(course_root / CONFIG_NAME, copy / CONFIG_NAME)
        source = source_dir(course_root)
        shutil.copytree(source, copy / source.relative_to(course_root),
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        release_dir = generate(copy)
        fresh = {p.name: nbformat.read(p, as_version=4) for p in sorted(release_dir.glob("*.ipynb"))}
    committed = {p.name: nbformat.read(p, as_version=4) for p in sorted(notebooks_dir.glob("*.ipynb"))}
    diffs = [f"{name}: missing from {notebooks_dir}" for name in fresh if name not in committed]
    diffs += [f"{name}: in {notebooks_dir} but no master generates it"
              for name in committed if name not in fresh]
    for name in sorted(fresh.keys() & committed.keys()):
        diffs += notebook_differences(fresh[name], committed[name], name)
    return diffs


# --- command line -----------------------------------------------------------------------------

def _shown(path: Path) -> str:
    """A path relative to the working directory where it lies below it, else as given."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def cmd_release(args) -> int:
    """``release``: setup cells, generate_assignment, copy to notebooks/."""
    release(args.course, args.notebooks or args.course.resolve().parent / "notebooks")
    return 0


def run_reference(course_root: Path, build: Path, *, timeout_s: int = 900) -> Path:
    """Execute the masters (the reference solutions) headless, in order, in ``build/run``.

    The notebooks share one results store, as a student's do, so 06 reads what 01-05 measured on
    this machine; 06 exports the report to ``build/report.html``. Executed copies are kept in
    ``build/run`` for reading. A failed test cell of a known shortfall on this device class is
    printed as a warning with its measurement; any other error raises CourseError after all six
    notebooks ran. Returns the report's path. Used by: ``make run``.
    """
    import time

    from nbclient import NotebookClient
    from tqdm.auto import tqdm

    from labsupport.hardware import describe_machine

    machine = describe_machine()
    device_class = machine.device_class
    build = Path(build).resolve()
    run_dir = build / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    report = build / "report.html"
    env = {"LAB_RESULTS": str(run_dir / "results"), "LAB_REPORT": str(report)}
    failures, shortfalls, times = [], [], {}
    with _environment(env):
        for master in tqdm(masters(course_root), desc="reference notebooks", unit="notebook"):
            nb = nbformat.read(master, as_version=4)
            started = time.perf_counter()
            NotebookClient(nb, timeout=timeout_s, kernel_name="python3", allow_errors=True,
                           resources={"metadata": {"path": str(run_dir)}}).execute()
            times[master.name] = time.perf_counter() - started
            nbformat.write(nb, run_dir / master.name)
            for cell in nb.cells:
                for out in cell.get("outputs", []):
                    if out.get("output_type") != "error":
                        continue
                    line = f"{master.name}, cell {cell.get('id')}: {out['ename']}: {out['evalue'][:300]}"
                    known = known_shortfall(cell.source, machine)
                    (shortfalls if known and out["ename"] == "AssertionError" else failures).append(line)
    for name, seconds in times.items():
        print(f"{name:28s} {seconds:6.0f} s")
    for line in shortfalls:
        print(f"known shortfall on {device_class} (reported, not hidden): {line}")
    if failures:
        raise CourseError("the reference notebooks raised (executed copies in "
                          f"{_shown(run_dir)}):\n" + "\n".join(failures))
    return report


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cmd_run(args) -> int:
    """``run``: execute the reference notebooks, then print the ladder and where the report is."""
    import pandas as pd

    from labsupport import report

    path = run_reference(args.course, args.build)
    lad = report.ladder(args.build.resolve() / "run" / "results")
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print("\nThe optimisation ladder on this machine:")
        print(lad.table.drop(columns=["stage"]).round(2).to_string(na_rep="-"))
        print(f"(-: not measured. {report.LADDER_NOTE})")
    for line in lad.missing:
        print("missing:", line)
    print(f"\nReport: {path}")
    return 0


def cmd_collect(args) -> int:
    """``collect``: per-student folders or zips into submitted/; a line per student."""
    from . import collect

    found = collect.collect(args.inbox, args.course)
    collect.print_collected(found)
    return 0


def cmd_grade(args) -> int:
    """``grade``: autograde, feedback, CSV exports and the summary."""
    from . import grade

    grades = grade.grade(args.course, args.student or None, timeout_s=args.timeout)
    grade.print_summary(grades, args.course)
    return 0


def cmd_calibrate(args) -> int:
    """``calibrate``: run the reference's checks, write and print this machine's thresholds."""
    import pandas as pd

    from . import calibrate

    path, table = calibrate.calibrate(args.runs, args.course, args.output)
    with pd.option_context("display.width", 200, "display.max_colwidth", 70):
        print(table.to_string())
    print(f"\nwrote {_shown(path)}: grading on this machine now uses the 'calibrated' column.")
    return 0


def cmd_report(args) -> int:
    """``report``: one student's report, the reference's, or the class summary, as HTML."""
    from . import reports

    if args.reference:
        path = reports.reference_report(args.build, args.output)
    elif args.student:
        path = reports.student_report(args.course, args.student, args.output)
    else:
        path = reports.class_report(args.course, args.output)
    print(f"wrote {_shown(path)}")
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
                     help="seconds a cell may run (default: per device class, see grade.py)")
    gra.set_defaults(func=cmd_grade)
    cal = sub.add_parser(
        "calibrate", help="derive this machine's thresholds from the reference solution's runs",
        description="Run the reference solutions' speed and memory checks RUNS times on this "
                    "machine and write calibration.toml (the rule: autograder/calibrate.py). "
                    "Prints class defaults against calibrated thresholds.")
    cal.add_argument("--runs", type=int, default=3, help="runs of the reference (default: %(default)s)")
    cal.add_argument("--output", type=Path, default=None,
                     help="calibration file (default: LAB_CALIBRATION or calibration.toml in the course root)")
    cal.set_defaults(func=cmd_calibrate)
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
        "run", help="execute the six reference notebooks in order, export the report to HTML",
        description="Execute the masters (reference solutions) headless in order on this "
                    "machine's profile in BUILD/run, export the comparison report to "
                    "BUILD/report.html, and print the ladder. This is `make run`.")
    run.add_argument("--build", type=Path, default=COURSE_ROOT.parent / "build",
                     help="output folder (default: build/ in the repository)")
    run.set_defaults(func=cmd_run)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one instructor command; a CourseError prints its message and exits with 1."""
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except CourseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
