"""The student distribution: what students get, with no answers (``build/student/`` and its zip).

``build_student_distribution`` writes a folder holding exactly

- ``notebooks/*.ipynb``: the student notebooks from nbgrader's release folder (no solutions, no
  hidden tests, outputs cleared);
- ``labsupport/``: the repository's helper package (its package data included, caches left out);
- ``pyproject.toml``: the repository's, which builds ``labsupport`` (pytest's section dropped);
- ``requirements.txt``: the repository's, less the instructor-only packages (nbgrader, pytest, pytest-xdist);
- ``README.md``: for students (``student_README.md`` beside this file);
- ``data/README.md``: the repository's (the dataset is generated on first use),

and the same files in a zip beside it (``build/student.zip``, ``pyproject.toml`` at its top
level), so that ``pip install <url of the zip>`` installs labsupport. Nothing from
``autograder/`` or ``tests/``, no master, no gradebook.

The setup cell (``setup_cell.py``) installs labsupport from ``LAB_URL`` where it is missing
(Colab); ``set_student_url`` writes that URL into the template, from which ``release`` copies it
into every master and student notebook.
"""

from __future__ import annotations

import keyword
import re
import shutil
import zipfile
from pathlib import Path

import nbformat

from .course import CourseError

STUDENT_README = Path(__file__).resolve().parent / "student_README.md"
INSTRUCTOR_ONLY = ("nbgrader", "pytest", "pytest-xdist")  # requirements students do not need (grading, tests)
# What the distribution may hold: these files, and files below these folders.
TOP_FILES = ("pyproject.toml", "requirements.txt", "README.md", "data/README.md")
TOP_FOLDERS = ("notebooks", "labsupport")
SKIP_PATTERNS = ("__pycache__", "*.pyc", "*.pyo", ".ipynb_checkpoints", ".DS_Store")  # never copied
# Left by nbgrader in a student version only if generate_assignment failed to clear a region.
ANSWER_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION",
                  "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
_URL_LINE = re.compile(r'^LAB_URL = "([^"\n]*)"', re.MULTILINE)
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed entry times: the same files give the same zip


class StudentDistributionError(CourseError):
    """The student distribution cannot be built or the URL set; the message says what to fix."""


# --- the install URL of the setup cell ----------------------------------------------------------

def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the setup cell's LAB_URL (None if it can).

    pip must be able to install it, in Colab: ``git+https://`` (a git repository holding
    build/student at its top, or ``#subdirectory=...``), an ``https://``, ``http://`` or
    ``file://`` URL of the zip or of a wheel, or a path ending in ``.zip`` or ``.whl``.
    """
    if not url:
        return "the URL is empty"
    if re.search(r'["\'\\\s]', url):
        return "the URL holds a quote, backslash, space or newline"
    if url.startswith("git+https://"):
        return None if len(url) > len("git+https://") else "the git URL names no repository"
    path = re.split(r"[?#]", url, maxsplit=1)[0]
    if not path.endswith((".zip", ".whl", ".tar.gz")):
        return ("pip installs a git+https:// repository, or a zip, wheel or .tar.gz (by https://, "
                "http://, file:// URL or a path); this URL ends in none of them")
    if "://" in url and not url.startswith(("https://", "http://", "file://")):
        return f"pip cannot install from a {url.split('://')[0]}:// URL in Colab"
    return None


def student_url(template: Path) -> str:
    """The LAB_URL written in the setup cell template ("" when none is set)."""
    found = _URL_LINE.findall(Path(template).read_text())
    if len(found) != 1:
        raise StudentDistributionError(
            f'{template}: expected one line LAB_URL = "..." in the setup cell, found {len(found)}')
    return found[0]


def set_student_url(template: Path, url: str) -> bool:
    """Write ``url`` into the setup cell template's ``LAB_URL = "..."`` line; True if it changed.

    Raises StudentDistributionError for a URL pip could not install from Colab (see
    :func:`url_problem`) or a template without exactly one such line. Only the quoted value
    changes; the file is rewritten only when it differs.
    """
    template = Path(template)
    problem = url_problem(url)
    if problem:
        raise StudentDistributionError(f"--student-url {url!r}: {problem}.")
    if student_url(template) == url:
        return False
    text = template.read_text()
    template.write_text(_URL_LINE.sub(lambda m: f'LAB_URL = "{url}"', text, count=1))
    return True


# --- the distribution ---------------------------------------------------------------------------

def _requirement_name(line: str) -> str | None:
    """The normalised project name a requirements line installs (None for comments, options)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
    if not match or line.lstrip().startswith(("#", "-")):
        return None
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def student_requirements(text: str) -> str:
    """The repository's requirements.txt without the instructor-only packages (INSTRUCTOR_ONLY)."""
    drop = {re.sub(r"[-_.]+", "-", name).lower() for name in INSTRUCTOR_ONLY}
    kept = [line for line in text.splitlines() if _requirement_name(line) not in drop]
    header = ("# For running the lab in JupyterLab on your own machine (see README.md):\n"
              "#   pip install -r requirements.txt -e .\n")
    return header + "\n".join(kept).rstrip("\n") + "\n"


def student_pyproject(text: str) -> str:
    """The repository's pyproject.toml without its ``[tool.pytest.ini_options]`` table."""
    out, skipping = [], False
    for line in text.splitlines():
        header = re.match(r"\s*\[\[?([^\]]+)\]\]?\s*(#.*)?$", line)
        if header:
            skipping = header.group(1).strip() == "tool.pytest.ini_options" or \
                header.group(1).strip().startswith("tool.pytest.ini_options.")
        if not skipping:
            out.append(line)
    return "\n".join(out).rstrip("\n") + "\n"


def _answer_markers_in(nb) -> list[str]:
    return [f"cell {i}: {marker}" for i, cell in enumerate(nb.cells)
            for marker in ANSWER_MARKERS if marker in cell.source]


def _check_release(release_dir: Path) -> list[Path]:
    """The release's notebooks, refusing outputs left in a code cell or an answer marker."""
    notebooks = sorted(Path(release_dir).glob("*.ipynb"))
    if not notebooks:
        raise StudentDistributionError(f"The release folder {release_dir} holds no notebooks: "
                                       "run nbgrader generate_assignment (python -m autograder release).")
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        dirty = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
                 and (cell.get("outputs") or cell.get("execution_count") is not None)]
        if dirty:
            raise StudentDistributionError(f"{path}: code cells {dirty} still have outputs or "
                                           "execution counts; nothing was built.")
        markers = _answer_markers_in(nb)
        if markers:
            raise StudentDistributionError(f"{path}: nbgrader left answer markers in the student "
                                           f"version ({'; '.join(markers)}); nothing was built.")
    return notebooks


def _prepare_out_dir(out_dir: Path, repo_root: Path) -> None:
    """Empty ``out_dir`` for a new build, refusing a folder that is not a distribution."""
    out_dir = out_dir.resolve()
    if out_dir == repo_root.resolve() or out_dir in repo_root.resolve().parents:
        raise StudentDistributionError(f"{out_dir} holds the repository: build the student "
                                       "distribution into its own folder (build/student).")
    if out_dir.exists():
        entries = {p.name for p in out_dir.iterdir()}
        allowed = {name.split("/")[0] for name in TOP_FILES + TOP_FOLDERS}
        if not entries <= allowed:
            raise StudentDistributionError(
                f"{out_dir} holds {sorted(entries - allowed)}, which a student distribution "
                "does not: refusing to replace it (choose an empty or new folder).")
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)


def distribution_files(folder: Path) -> list[str]:
    """The files below ``folder``, as sorted POSIX paths relative to it."""
    folder = Path(folder)
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def write_zip(folder: Path, zip_path: Path) -> Path:
    """Zip ``folder``'s files at the zip's top level, in name order with fixed times."""
    zip_path = Path(zip_path)
    tmp = zip_path.with_name(zip_path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in distribution_files(folder):
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, (Path(folder) / name).read_bytes())
    tmp.replace(zip_path)
    return zip_path


def build_student_distribution(release_dir: Path, out_dir: Path, *, repo_root: Path) -> Path:
    """Write the student distribution to ``out_dir`` and its zip beside it; return the zip.

    ``release_dir`` is nbgrader's release folder of the assignment (``release/lab``), whose
    notebooks must have outputs cleared and no answer markers; ``repo_root`` the repository
    (``labsupport/``, pyproject.toml, requirements.txt, data/README.md). ``out_dir`` is replaced,
    unless it holds something a distribution does not. The zip is
    ``out_dir.with_suffix(".zip")``.
    """
    repo_root, out_dir = Path(repo_root), Path(out_dir)
    notebooks = _check_release(release_dir)
    package = repo_root / "labsupport"
    needed = [package / "__init__.py", repo_root / "pyproject.toml",
              repo_root / "requirements.txt", repo_root / "data" / "README.md", STUDENT_README]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise StudentDistributionError(f"cannot build the student distribution: missing {missing}")
    _prepare_out_dir(out_dir, repo_root)

    (out_dir / "notebooks").mkdir()
    for path in notebooks:
        shutil.copyfile(path, out_dir / "notebooks" / path.name)
    shutil.copytree(package, out_dir / "labsupport", ignore=shutil.ignore_patterns(*SKIP_PATTERNS))
    (out_dir / "pyproject.toml").write_text(student_pyproject((repo_root / "pyproject.toml").read_text()))
    (out_dir / "requirements.txt").write_text(
        student_requirements((repo_root / "requirements.txt").read_text()))
    shutil.copyfile(STUDENT_README, out_dir / "README.md")
    (out_dir / "data").mkdir()
    shutil.copyfile(repo_root / "data" / "README.md", out_dir / "data" / "README.md")
    return write_zip(out_dir, out_dir.with_suffix(".zip"))


# --- answers that must not be handed out (used by tests/test_student.py) ------------------------

def _code_lines(text: str) -> list[str]:
    """Stripped lines without blank lines, comment lines and trailing ``  # comments``."""
    lines = []
    for line in text.splitlines():
        line = re.sub(r"\s{2,}#\s.*$", "", line).strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def answer_regions(master: Path) -> list[tuple[str, list[str]]]:
    """Each answer of a master: (where, its lines as :func:`_code_lines` gives them).

    An answer is a region between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` or between
    ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``, or a whole solution cell without
    markers (a written answer, e.g. 06's model analysis), which nbgrader replaces whole.
    """
    nb = nbformat.read(master, as_version=4)
    regions = []
    for i, cell in enumerate(nb.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        where = f"{Path(master).name} cell {i} ({grade_id})" if grade_id else f"{Path(master).name} cell {i}"
        if cell.metadata.get("nbgrader", {}).get("solution") and not any(
                marker in cell.source for marker in ANSWER_MARKERS):
            regions.append((where, _code_lines(cell.source)))
            continue
        inside, current = False, []
        for line in cell.source.splitlines():
            if "### BEGIN SOLUTION" in line or "### BEGIN HIDDEN TESTS" in line:
                inside, current = True, []
            elif "### END SOLUTION" in line or "### END HIDDEN TESTS" in line:
                inside = False
                regions.append((where, _code_lines("\n".join(current))))
            elif inside:
                current.append(line)
    return regions


def text_sources(folder: Path) -> dict[str, list[str]]:
    """Every text file below ``folder`` as its lines (:func:`_code_lines`); a notebook as its
    cells' sources, cell after cell (not its JSON)."""
    texts = {}
    for name in distribution_files(folder):
        path = Path(folder) / name
        if path.suffix == ".ipynb":
            nb = nbformat.read(path, as_version=4)
            texts[name] = _code_lines("\n".join(cell.source for cell in nb.cells))
            continue
        try:
            texts[name] = _code_lines(path.read_text())
        except UnicodeDecodeError:
            continue  # not text: no source line can be in it
    return texts


def structural(line: str) -> bool:
    """True for a line of keywords and punctuation only (``try:``, ``else:``, ``yield``,
    ``return None``, ``)``): the shape of code, not its content."""
    return not re.search(r"\d|['\"]", line) and all(
        word in keyword.kwlist for word in re.findall(r"[A-Za-z_]\w*", line))


def answer_leaks(folder: Path, masters: list[Path], *, min_chars: int = 30, run: int = 3) -> list[str]:
    """Where the masters' answers appear in the files below ``folder``: one line per finding.

    Lines are compared whole, stripped, without comments (blank and comment lines and trailing
    ``  # comments`` dropped). A finding is an answer line of at least ``min_chars`` characters
    found as a line of a file, or ``run`` consecutive answer lines (of any length) found as
    consecutive lines of a file, where consecutive skips :func:`structural` lines (``try:``,
    ``yield``, ``finally:`` follow each other in any context manager). Shorter lines alone
    (``else:``, ``return table``, ``step()``) are idioms that labsupport's own code and the
    notebooks' given code use too.
    """
    def runs_of(lines):
        lines = [line for line in lines if not structural(line)]
        return [tuple(lines[i:i + run]) for i in range(len(lines) - run + 1)]

    texts = text_sources(folder)
    line_sets = {name: set(lines) for name, lines in texts.items()}
    runs = {name: set(runs_of(lines)) for name, lines in texts.items()}
    found = []
    for master in masters:
        for where, lines in answer_regions(master):
            for line in dict.fromkeys(lines):
                if len(line) >= min_chars:
                    found += [f"{name}: line {line!r} of the answer in {where}"
                              for name, present in line_sets.items() if line in present]
            for seq in dict.fromkeys(runs_of(lines)):
                if any(len(line) >= min_chars for line in seq):
                    continue  # a long line is reported on its own
                found += [f"{name}: {run} consecutive lines {list(seq)!r} of the answer in {where}"
                          for name, present in runs.items() if seq in present]
    return list(dict.fromkeys(found))
