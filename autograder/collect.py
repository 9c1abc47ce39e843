"""``collect``: put a folder of submissions into nbgrader's ``submitted/<student>/<assignment>/``.

The inbox holds one entry per student: a folder ``<student>/`` or a zip file ``<student>.zip``
(an LMS download, a shared drive). Inside, the notebooks may sit at any depth. Each student is
collected on their own: a malformed zip, a missing or misnamed notebook or an unreadable one
gives a message for that student, and the others are collected all the same.

Names are matched leniently where the intent is plain (``Copy of 02_data_loading.ipynb`` from
Colab, ``02_data_loading (1).ipynb`` from a browser download, ``02-Data-Loading.ipynb``), and
the student is told; anything else is reported as unexpected and not graded.

An inbox is untrusted: links (to the masters, to a system file) are skipped with a note, never
followed; a notebook is read up to MAX_NOTEBOOK_BYTES, a zip's entries are capped before they
are decompressed (a zip bomb costs its own student only), and any error collecting one student
is that student's problem, reported, while the others are collected.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import nbformat

from . import course

MAX_NOTEBOOK_BYTES = 32 * 2**20  # a lab notebook with its outputs cleared is well under 1 MiB
MAX_ZIP_ENTRIES = 10_000
_IGNORED_PARTS = {"__MACOSX", ".ipynb_checkpoints"}


@dataclass
class Collected:
    """What collect did with one student's entry in the inbox."""

    student: str
    source: str  # the inbox entry: folder or zip name
    notebooks: list[str] = field(default_factory=list)  # collected, by notebook name
    problems: list[str] = field(default_factory=list)  # one sentence each: what is wrong, what to do
    renamed: list[str] = field(default_factory=list)  # "their name -> our name"
    not_graded: list[str] = field(default_factory=list)  # optional notebooks handed in, left out

    @property
    def ok(self) -> bool:
        return not self.problems


def canonical(name: str) -> str:
    """A notebook file name reduced to what identifies it: no 'Copy of', '(1)', case or -/_ ."""
    stem = name[:-len(".ipynb")] if name.lower().endswith(".ipynb") else name
    stem = re.sub(r"^(copy of\s+)+", "", stem.strip(), flags=re.IGNORECASE)
    stem = re.sub(r"\s*\(\d+\)$|\s*-\s*copy$|\s+copy$", "", stem, flags=re.IGNORECASE)
    return re.sub(r"[\s_-]+", "_", stem).lower()


class TooLarge(ValueError):
    """A notebook in the inbox over MAX_NOTEBOOK_BYTES."""


def _read_file(path: Path) -> bytes:
    """A regular file's bytes, the file opened without following a link, up to the cap."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TooLarge("not a regular file")
        data = f.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise TooLarge(f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB")
    return data


def _read_entry(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """A zip entry's bytes, decompressed no further than the cap (its header's size may lie)."""
    if info.file_size > MAX_NOTEBOOK_BYTES:
        raise TooLarge(f"{info.file_size} bytes once unpacked, over {MAX_NOTEBOOK_BYTES // 2**20} MiB")
    with archive.open(info) as f:
        data = f.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise TooLarge(f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB once unpacked")
    return data


def _notebook_files(entry: Path, skipped: list[str]):
    """(relative name, bytes reader) for every .ipynb in a folder or zip, skipping OS litter;
    links (and what is not a file) are not followed but noted in ``skipped``."""
    if entry.is_dir():
        for top, dirs, files in os.walk(entry):  # links to folders are listed, never entered
            for name in sorted(dirs):
                if os.path.islink(os.path.join(top, name)):
                    skipped.append(f"{Path(top, name).relative_to(entry)}: a link, not followed")
            for name in sorted(files):
                path = Path(top) / name
                rel = path.relative_to(entry)
                if not name.lower().endswith(".ipynb") or _IGNORED_PARTS & set(rel.parts) or name.startswith("._"):
                    continue
                if path.is_symlink():
                    skipped.append(f"{rel}: a link, not followed; hand in the notebook itself")
                    continue
                yield str(rel), (lambda path=path: _read_file(path))
        return
    with zipfile.ZipFile(entry) as archive:  # BadZipFile is handled by the caller
        infos = archive.infolist()
        if len(infos) > MAX_ZIP_ENTRIES:
            raise TooLarge(f"{len(infos)} entries in the zip (at most {MAX_ZIP_ENTRIES})")
        for info in infos:
            rel = PurePosixPath(info.filename)
            if info.is_dir() or rel.suffix.lower() != ".ipynb" or _IGNORED_PARTS & set(rel.parts) \
                    or rel.name.startswith("._"):
                continue
            if stat.S_ISLNK(info.external_attr >> 16):
                skipped.append(f"{rel}: a link in the zip, not followed; hand in the notebook itself")
                continue
            yield str(rel), (lambda info=info: _read_entry(archive, info))


def collect_one(entry: Path, expected: list[str], destination: Path, optional: tuple[str, ...] = ()) -> Collected:
    """Collect one inbox entry into ``destination/<student>/`` (replacing what was there).

    ``optional`` names the lab's ungraded notebooks: handed in, they are noted and left out.
    """
    student = entry.stem if entry.suffix.lower() == ".zip" else entry.name
    result = Collected(student, entry.name)
    try:
        course.check_student_id(student)
    except course.CourseError as err:
        result.problems.append(f"{entry.name}: {err} Rename the folder or zip to the student's id.")
        return result
    by_canonical = {canonical(name): name for name in expected}
    found: dict[str, tuple[str, bytes]] = {}
    skipped: list[str] = []
    try:
        for rel, read in _notebook_files(entry, skipped):
            name = PurePosixPath(rel).name
            target = name[:-len(".ipynb")] if name in {f"{e}.ipynb" for e in expected} \
                else by_canonical.get(canonical(name))
            if target is None and canonical(name) in {canonical(o) for o in optional}:
                result.not_graded.append(f"{rel}: optional, not graded; it was left out")
                continue
            if target is None:
                result.problems.append(f"{rel}: not a notebook of this lab (expected "
                                       f"{', '.join(e + '.ipynb' for e in expected)}); it is not graded.")
                continue
            if target in found:
                result.problems.append(f"{rel}: a second copy of {target}.ipynb (kept "
                                       f"{found[target][0]}); submit one copy of each notebook.")
                continue
            try:
                found[target] = (rel, read())
            except (TooLarge, OSError) as err:
                result.problems.append(f"{rel}: not collected ({err}); {target}.ipynb scores 0 unless "
                                       "it is resubmitted.")
    except (zipfile.BadZipFile, TooLarge, OSError, EOFError, NotImplementedError) as err:
        result.problems.append(f"{entry.name}: not a readable zip file ({err}); ask {student} to "
                               "submit again (a zip of the notebooks), or unpack it into a folder.")
        return result
    finally:
        result.not_graded += skipped
    folder = destination / student / "lab_tmp"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for target, (rel, data) in sorted(found.items()):
        try:
            nb = nbformat.reads(data.decode("utf-8"), as_version=4)
        except Exception as err:  # JSON, encoding or schema: the student must resubmit this one
            result.problems.append(f"{rel}: not a readable notebook ({type(err).__name__}: "
                                   f"{str(err).splitlines()[0][:120]}); {target}.ipynb scores 0 "
                                   "unless it is resubmitted.")
            continue
        nbformat.write(nb, folder / f"{target}.ipynb")
        result.notebooks.append(target)
        if PurePosixPath(rel).name != f"{target}.ipynb":
            result.renamed.append(f"{rel} -> {target}.ipynb")
    for name in expected:
        if name not in found:
            result.problems.append(f"{name}.ipynb is missing: it scores 0 unless it is submitted.")
    return result


def collect(inbox: Path, where: course.Course | Path = course.COURSE_ROOT) -> list[Collected]:
    """Collect every student folder or zip in ``inbox`` into the course's ``submitted/``.

    A student's earlier submission is replaced. Returns one Collected per inbox entry, in name
    order; entries that are neither a folder nor a zip are reported and skipped.
    """
    inbox, the = Path(inbox), course.of(where)
    if not inbox.is_dir():
        raise course.CourseError(f"{inbox} is not a folder: pass the folder that holds one folder "
                                 "or zip file per student.")
    assignment = the.assignment
    expected = [p.stem for p in course.graded_masters(the.root)]
    optional = tuple(p.stem for p in course.masters(the.root) if p.stem not in expected)
    submitted = the.root / "submitted"
    out = []
    for entry in sorted(inbox.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_symlink():
            out.append(Collected(entry.stem, entry.name, problems=[
                f"{entry.name}: a link, not followed: put the student's folder or zip itself in the inbox."]))
            continue
        if not (entry.is_dir() or entry.suffix.lower() == ".zip"):
            out.append(Collected(entry.stem, entry.name, problems=[
                f"{entry.name}: neither a student folder nor a zip file; it was skipped."]))
            continue
        try:
            result = collect_one(entry, expected, submitted, optional)
        except (Exception, MemoryError) as err:  # one student's inbox entry never stops the others
            out.append(Collected(entry.stem, entry.name, problems=[
                f"{entry.name}: could not be collected ({type(err).__name__}: {str(err)[:200]}); "
                "ask the student to submit again."]))
            continue
        staged = submitted / result.student / "lab_tmp"
        if staged.is_dir():  # swap in the new submission only once it was read
            final = submitted / result.student / assignment
            shutil.rmtree(final, ignore_errors=True)
            staged.rename(final)
        out.append(result)
    return out


def print_collected(collected: list[Collected]) -> None:
    """One line per student, then their problems and renames, indented."""
    for c in collected:
        status = "ok" if c.ok else "PROBLEMS"
        print(f"{c.student:20s} {len(c.notebooks)} notebook(s) collected  {status}")
        for line in c.renamed:
            print(f"    renamed: {line}")
        for line in c.not_graded:
            print(f"    {line}")
        for line in c.problems:
            print(f"    {line}")
    bad = sum(not c.ok for c in collected)
    print(f"{len(collected)} submission(s) collected, {bad} with problems (listed above).")
