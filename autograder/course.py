"""The course's core: its paths and nbgrader configuration, read by every instructor command.

A course is a folder holding ``nbgrader_config.py`` and ``source/``; grading adds the gradebook,
``submitted/``, ``autograded/``, ``verdicts/``, ``results/``, ``feedback/`` and the CSVs. It is
:class:`Course`, built once per folder by :func:`of` (its configuration read once, and again only
when the file changes). The commands live one per module (``release``, ``run``, ``collect``,
``grade``, ``calibrate``, ``reports``) and the command line in ``cli``; each takes the course (a
``Course``, or its folder) as an argument, so tests can run them on a temporary copy of the
course and never touch the real release or gradebook. This module imports none of them.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import nbformat

COURSE_ROOT = Path(__file__).resolve().parent  # autograder/
REPO_ROOT = COURSE_ROOT.parent  # the instructor's repository
NOTEBOOKS_DIR = COURSE_ROOT.parent / "notebooks"  # the committed student versions
SETUP_TEMPLATE = COURSE_ROOT / "setup_cell.py"  # the first code cell of every notebook
CONFIG_NAME = "nbgrader_config.py"
SETUP_GRADE_ID = "setup"  # nbgrader grade_id of every master's first code cell


class CourseError(RuntimeError):
    """A course command cannot go on; the message says what to fix or run."""


STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")


def check_student_id(student: str) -> str:
    """``student``, checked to be a usable student id; else CourseError saying what is allowed.

    An id is a folder name in every course folder (submitted/, autograded/, results/, feedback/,
    sandbox/students/): letters, digits and ``_ . @ + -``, starting with a letter or digit, at most
    64 characters, so no id is a path, a hidden file or ``..``, nor names a folder of the grader's
    own (each command keeps the students' folders apart from its own)."""
    if not isinstance(student, str) or not STUDENT_ID.match(student):
        raise CourseError(f"{student!r} is not a usable student id: use letters, digits and _ . @ + - "
                          "only, starting with a letter or digit, at most 64 characters.")
    return student


# --- the course, its configuration and notebooks ----------------------------------------------

@dataclass(frozen=True, eq=False)
class Course:
    """One course folder, and where everything in it lies. Build it with :func:`of`."""

    root: Path  # resolved

    @cached_property
    def config(self):
        """The traitlets Config of ``nbgrader_config.py``, rooted at this folder. Shared: an
        nbgrader app takes :meth:`app_config`, a copy of it."""
        from traitlets.config.loader import PyFileConfigLoader

        path = self.root / CONFIG_NAME
        if not path.exists():
            raise CourseError(f"{path} does not exist: the course root must hold nbgrader's config.")
        cfg = PyFileConfigLoader(CONFIG_NAME, path=str(self.root)).load_config()
        # The config computes its root from __file__; pin it anyway, so that a command pointed at
        # a temporary copy of the course can never write into the real one.
        cfg.CourseDirectory.root = str(self.root)
        return cfg

    def app_config(self):
        """A copy of :attr:`config`, for one nbgrader app to change as it likes."""
        return copy.deepcopy(self.config)

    @cached_property
    def assignment(self) -> str:
        """The course's one assignment id (``ASSIGNMENT`` in nbgrader_config.py)."""
        value = self.config.CourseDirectory.get("assignment_id", "")
        if not value:
            raise CourseError(f"{self.root / CONFIG_NAME} sets no CourseDirectory.assignment_id.")
        return value

    @property
    def source(self) -> Path:
        """The folder of the masters and their files: ``source/``."""
        return self.root / self.config.CourseDirectory.get("source_directory", "source")

    @property
    def masters_dir(self) -> Path:
        """The folder of the master notebooks: ``source/<assignment>/``."""
        return self.source / self.assignment

    @property
    def gradebook_path(self) -> Path:
        return self.root / "gradebook.db"

    @property
    def gradebook_url(self) -> str:
        return f"sqlite:///{self.gradebook_path}"

    @contextlib.contextmanager
    def gradebook(self):
        """nbgrader's Gradebook of this course, open for a ``with`` block."""
        from nbgrader.api import Gradebook

        with venv_on_path(), Gradebook(self.gradebook_url) as gb:
            yield gb

    def submitted(self, student: str) -> Path:
        """``student``'s notebooks as collected: ``submitted/<student>/<assignment>/``."""
        return self.root / "submitted" / check_student_id(student) / self.assignment

    def autograded(self, student: str) -> Path:
        """``student``'s notebooks as nbgrader ran them: ``autograded/<student>/<assignment>/``."""
        return self.root / "autograded" / check_student_id(student) / self.assignment

    def feedback(self, student: str) -> Path:
        return self.root / "feedback" / check_student_id(student) / self.assignment

    def verdicts(self, student: str) -> Path:
        """The judge's decisions on ``student``'s notebooks, one JSON file each."""
        return self.root / "verdicts" / check_student_id(student)

    def results(self, student: str) -> Path:
        """The grader's measurements of ``student``'s code (06's ladder reads them)."""
        return self.root / "results" / check_student_id(student)

    @property
    def calibration(self) -> Path:
        """The course's calibration file: ``LAB_CALIBRATION``, else ``calibration.toml`` here.
        calibrate writes it and grade hands it to the notebooks it runs."""
        return Path(os.environ.get("LAB_CALIBRATION") or self.root / "calibration.toml")


_COURSES: dict[tuple, Course] = {}


def of(where: "Course | Path | str" = None) -> Course:
    """The :class:`Course` of a folder (default: this repository's course, ``autograder/``),
    the same object for every call until its ``nbgrader_config.py`` changes. A Course is returned
    as it is."""
    if isinstance(where, Course):
        return where
    root = Path(COURSE_ROOT if where is None else where).resolve()
    try:
        info = (root / CONFIG_NAME).stat()
        key = (root, info.st_mtime_ns, info.st_size)
    except OSError:
        key = (root, None, None)  # Course.config says what is missing, when it is read
    if key not in _COURSES:
        _COURSES[key] = Course(root)
    return _COURSES[key]


def calibration_file(course_root: Path) -> Path:
    """The course's calibration file (:attr:`Course.calibration`)."""
    return of(course_root).calibration


def load_config(course_root: Path = COURSE_ROOT):
    """A copy of the course's nbgrader Config (:meth:`Course.app_config`)."""
    return of(course_root).app_config()


def assignment_id(course_root: Path = COURSE_ROOT) -> str:
    """The course's one assignment id (:attr:`Course.assignment`)."""
    return of(course_root).assignment


def source_dir(course_root: Path = COURSE_ROOT) -> Path:
    """The folder of the masters and their files (:attr:`Course.source`)."""
    return of(course_root).source


def masters_dir(course_root: Path = COURSE_ROOT) -> Path:
    """The folder of the master notebooks (:attr:`Course.masters_dir`)."""
    return of(course_root).masters_dir


def masters(course_root: Path = COURSE_ROOT) -> list[Path]:
    """The master notebooks, ``source/<assignment>/*.ipynb``, in name order (nbgrader's order)."""
    return sorted(masters_dir(course_root).glob("*.ipynb"))


def graded_masters(course_root: Path = COURSE_ROOT) -> list[Path]:
    """The masters that are graded: those with an autograded test cell. An optional notebook
    (08_distributed) has none; it is released to students, but neither collected nor graded."""
    return [p for p in masters(course_root) if graded_test_cells(nbformat.read(p, as_version=4))]


def lab_order(names) -> list[str]:
    """Notebook names in the lab's order: by their number prefix (01_profile before 02_...).

    Raises CourseError for a name without the two-digit prefix, since its place would be a guess.
    """
    names = list(names)
    unnumbered = [n for n in names if not (len(n) > 2 and n[:2].isdigit() and n[2] == "_")]
    if unnumbered:
        raise CourseError(f"notebooks {unnumbered} have no 'NN_' number prefix: the lab runs "
                          "its notebooks in numbered order, so name every master 'NN_<topic>'.")
    return sorted(names, key=lambda n: (int(n[:2]), n))


def setup_cell_source(template: Path = SETUP_TEMPLATE) -> str:
    """The setup cell's source: the template file's text without its trailing newline."""
    return Path(template).read_text().rstrip("\n")


def first_code_cell(nb) -> nbformat.NotebookNode | None:
    """The first code cell of a notebook, or None if it has none."""
    return next((cell for cell in nb.cells if cell.cell_type == "code"), None)


def setup_cell_metadata_problem(cell, name: str) -> str | None:
    """Why ``cell`` is not the locked nbgrader setup cell (None if it is)."""
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
    problems = [setup_cell_metadata_problem(cell, name)]
    if cell.source != setup_cell_source(template):
        problems.append(f"{name}: the setup cell differs from {Path(template).name}")
    return [p for p in problems if p]


def graded_test_cells(nb) -> list[nbformat.NotebookNode]:
    """The autograded test cells of a notebook: code cells with nbgrader grade true."""
    return [cell for cell in nb.cells
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade")
            and not cell.metadata["nbgrader"].get("solution")]


def declared_checks(cell, notebook: str) -> list[str]:
    """The check ids a graded test cell grades, as its master declares them in the cell's metadata
    (``"lab": {"checks": ["02-loader-speedup"]}``); a CourseError naming the cell if it declares none.
    The grader reads them from the masters only, never from a submission."""
    checks = cell.metadata.get("lab", {}).get("checks")
    if not checks or not all(isinstance(c, str) for c in checks):
        raise CourseError(f"{notebook}, test cell {cell.metadata['nbgrader']['grade_id']}: declare the checks "
                          'it grades in its metadata, as "lab": {"checks": ["NN-check-id", ...]}.')
    return list(checks)


def uncleared_cells(nb) -> list[int]:
    """Indices of code cells that still hold outputs or an execution count."""
    return [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            and (cell.get("outputs") or cell.get("execution_count") is not None)]


@contextlib.contextmanager
def venv_on_path():
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


@contextlib.contextmanager
def environment(values: dict[str, str]):
    """Set environment variables for the duration of a ``with`` block, then restore them."""
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



def shown(path: Path) -> str:
    """A path relative to the working directory where it lies below it, else as given."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
