"""``release``: the student versions of the masters, and the student distribution.

- The setup cell (``setup_cell.py``, with the install URL set by ``--student-url``) is written
  into every master, nbgrader generate_assignment makes the student versions, and they are
  copied, outputs cleared, into ``notebooks/``.
- The student distribution (``build/student/`` and ``build/student.zip``, :mod:`.student`) holds
  those notebooks, the student-facing ``labsupport``, a requirements file and a README, and
  nothing else: no solution, no hidden test, no instructor module.
- ``student_version_differences`` backs the test that notebooks/ is a fresh release.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import nbformat

from . import course
from .course import (CONFIG_NAME, NOTEBOOKS_DIR, REPO_ROOT, SETUP_TEMPLATE, CourseError, first_code_cell,
                     graded_test_cells, setup_cell_metadata_problem, setup_cell_source, shown, uncleared_cells,
                     venv_on_path)


def sync_setup_cells(where: course.Course | Path = course.COURSE_ROOT,
                     template: Path = SETUP_TEMPLATE) -> list[Path]:
    """Write the template into every master's setup cell; return the masters that changed.

    Only the cell's source is replaced (its nbgrader metadata stays); a master is rewritten
    only when its setup cell differs, so unchanged masters keep their bytes.
    """
    source = setup_cell_source(template)
    changed = []
    for path in course.masters(course.of(where).root):
        nb = nbformat.read(path, as_version=4)
        cell = first_code_cell(nb)
        problem = (f"{path.name}: has no code cell; its first code cell must be the setup cell"
                   if cell is None else setup_cell_metadata_problem(cell, path.name))
        if problem:
            raise CourseError(problem)
        if cell.source != source:
            cell.source = source
            nbformat.write(nb, path)
            changed.append(path)
    return changed


def generate(where: course.Course | Path = course.COURSE_ROOT) -> Path:
    """Run nbgrader generate_assignment --force in the course; return the release folder.

    Updates the course's gradebook (``gradebook.db`` in its root): autograde needs its record of
    the masters' grade and locked cells.
    """
    from nbgrader.converters import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.utils import capture_log

    the = course.of(where)
    if not course.masters(the.root):
        raise CourseError(f"No master notebooks (*.ipynb) in {the.masters_dir}.")
    cfg = the.app_config()
    coursedir = CourseDirectory(config=cfg)
    app = GenerateAssignment(coursedir=coursedir, config=cfg)
    app.force = True
    app.create_assignment = True
    with venv_on_path():
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


def release(where: course.Course | Path = course.COURSE_ROOT, notebooks_dir: Path = NOTEBOOKS_DIR,
            template: Path = SETUP_TEMPLATE, *, student_url: str | None = None,
            student_dir: Path | None = REPO_ROOT / "build" / "student") -> list[Path]:
    """Sync the setup cells, generate the student versions, copy them to ``notebooks_dir``, and
    write the student distribution to ``student_dir`` (and its zip beside it; None: skip it).

    ``student_url`` is written into the setup cell template first: where Colab installs the
    student distribution from. It stays in the template for later releases.
    """
    from . import student

    the = course.of(where)
    if student_url is not None:
        if student.set_student_url(Path(template), student_url):
            print(f"set LAB_URL = {student_url!r} in {Path(template).name}")
    for path in sync_setup_cells(the, template):
        print(f"updated the setup cell of {shown(path)} from {Path(template).name}")
    release_dir = generate(the)
    written = copy_release(release_dir, notebooks_dir)
    for path in written:
        print(f"wrote {shown(path)} ({describe(path)})")
    if student_dir is not None:
        archive = student.build_student_distribution(release_dir, Path(student_dir), repo_root=REPO_ROOT)
        leaks = student.answer_leaks(Path(student_dir), course.masters(the.root))
        if leaks:  # an answer in labsupport or a notebook: the distribution must not go out
            shutil.rmtree(student_dir)
            archive.unlink()
            raise CourseError("the student distribution would hand out answers; nothing was "
                              "written:\n" + "\n".join(leaks[:20]))
        size = sum(p.stat().st_size for p in Path(student_dir).rglob("*") if p.is_file())
        print(f"wrote the student distribution {shown(student_dir)}/ ({size / 1024:.0f} KiB) and "
              f"{shown(archive)} ({archive.stat().st_size / 1024:.0f} KiB)")
        if not student.student_url(Path(template)):
            print("note: no --student-url is set, so in Colab the setup cell stops and says so; host "
                  f"{shown(archive)} (or build/student as a git repository) and release again with "
                  "--student-url URL.")
    return written


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


def student_version_differences(where: course.Course | Path = course.COURSE_ROOT,
                                notebooks_dir: Path = NOTEBOOKS_DIR) -> list[str]:
    """How ``notebooks_dir`` differs from a fresh release of the masters ([] if it matches).

    The release is generated in a temporary copy of the course (config and source only), so
    the real release folder and gradebook are never touched.
    """
    the, notebooks_dir = course.of(where), Path(notebooks_dir)
    with tempfile.TemporaryDirectory(prefix="lab-course-") as tmp:
        copy = Path(tmp) / "course"
        copy.mkdir()
        shutil.copyfile(the.root / CONFIG_NAME, copy / CONFIG_NAME)
        shutil.copytree(the.source, copy / the.source.relative_to(the.root),
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
