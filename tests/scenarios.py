"""Scenario submissions for the instructor pipeline's tests: one folder per scenario, in
``tests/scenarios/``, one file per notebook it hands in.

A scenario is what one kind of student hands in. Its folder holds ``scenario.toml`` (``about``:
what the student did; ``attack = true`` for an attack on the grader, graded only where there is
a sandbox; ``every_notebook = "reference"`` or ``"release"`` to hand in every notebook so) and a
file per notebook handed in, named as the notebook (``02_data_loading.cells``). A notebook with no
file is not handed in (it scores 0). The submissions are built from the release and the masters,
not committed, so they follow the lab whenever it changes.

A notebook's file starts from ``# base: reference`` (the release with every solution cell taken
from the master) or ``# base: release`` (the release as handed out), then changes it cell by
cell, in sections opened by ``# %% <what> <grade id>`` (Jupyter's percent format):

- ``replace``: the cell's source becomes the section's text;
- ``after``: a new code cell after that cell (several in a row land in the file's order);
- ``prepend`` / ``extend``: the text before / after the cell's source;
- ``append`` (no grade id): a new code cell at the end of the notebook;
- ``edit``: blocks of ``<<<<<<<`` the master's lines ``=======`` their replacement ``>>>>>>>``,
  each an error if the master no longer holds those lines (so a changed master fails loudly).

``python tests/scenarios.py <inbox>`` writes them for ``python -m autograder collect``.
"""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path

import nbformat

from autograder import reference as answers

FOLDER = Path(__file__).resolve().parent / "scenarios"
SCENARIOS = tuple(sorted(p.parent.name for p in FOLDER.glob("*/scenario.toml")))
BASES = ("reference", "release")
SECTION = re.compile(r"^# %% (replace|after|prepend|extend|edit|append)(?: (\S+))?$", re.M)
EDIT = re.compile(r"^<<<<<<<\n(.*?)^=======\n(.*?)^>>>>>>>$", re.M | re.S)


def about(scenario: str) -> dict:
    """``scenario.toml`` of ``scenario``."""
    return tomllib.loads((FOLDER / scenario / "scenario.toml").read_text())


ATTACKS = tuple(s for s in SCENARIOS if about(s).get("attack"))


def _by_id(nb, grade_id: str):
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return cell
    raise KeyError(f"no cell with grade_id {grade_id!r}")


def sections(path: Path) -> tuple[str, list[tuple[str, str | None, str]]]:
    """A notebook file's base and its ``(what, grade id, text)`` sections, in the file's order."""
    text = path.read_text()
    first, _, rest = text.partition("\n")
    base = first.removeprefix("# base:").strip()
    if not first.startswith("# base:") or base not in BASES:
        raise ValueError(f"{path}: the first line must be '# base: reference' or '# base: release'")
    heads = list(SECTION.finditer(rest))
    if rest[:heads[0].start() if heads else len(rest)].strip():
        raise ValueError(f"{path}: text before the first '# %%' section")
    out = []
    for head, after in zip(heads, heads[1:] + [None]):
        body = rest[head.end():after.start() if after else len(rest)].strip("\n")
        if (head.group(1) == "append") != (head.group(2) is None):
            raise ValueError(f"{path}: '{head.group(0)}': only 'append' goes without a grade id")
        out.append((head.group(1), head.group(2), body))
    return base, out


def section(scenario: str, notebook: str, what: str, grade_id: str | None = None) -> str:
    """The text of the first ``what grade_id`` section of ``scenario``'s ``notebook`` (tests reuse some)."""
    _, found = sections(FOLDER / scenario / f"{notebook}.cells")
    return next(text for w, g, text in found if (w, g) == (what, grade_id))


def timed_from_my_stack() -> str:
    """``_timed()``, which looks for labsupport's timing on its call stack, as a clever student
    writes it after reading the student distribution (shortcuts' 03 does less when it is true;
    tests/test_checks.py reuses it)."""
    return section("shortcuts", "03_amp", "prepend", "amp_train_step")


def _edited(source: str, blocks: str, where: str) -> str:
    pairs = EDIT.findall(blocks)
    if not pairs or EDIT.sub("", blocks).strip():
        raise ValueError(f"{where}: an edit section is only <<<<<<< old ======= new >>>>>>> blocks")
    for old, new in pairs:
        if old not in source:
            raise ValueError(f"{where}: the master's solution changed: {old!r} is not in it; update the scenario")
        source = source.replace(old, new, 1)
    return source


def _apply(nb, changes: list[tuple[str, str | None, str]], where: str) -> None:
    last_after = {}  # grade id -> the cell inserted after it last, so that several land in order
    for what, grade_id, text in changes:
        if what == "append":
            nb.cells.append(nbformat.v4.new_code_cell(text))
            continue
        cell = _by_id(nb, grade_id)
        if what == "replace":
            cell.source = text
        elif what == "prepend":
            cell.source = text + "\n\n" + cell.source
        elif what == "extend":
            cell.source = cell.source.rstrip("\n") + "\n\n\n" + text + "\n"
        elif what == "edit":
            cell.source = _edited(cell.source, text + "\n", f"{where}, {grade_id}")
        elif what == "after":
            new = nbformat.v4.new_code_cell(text)
            nb.cells.insert(nb.cells.index(last_after.get(grade_id, cell)) + 1, new)
            last_after[grade_id] = new


def build(scenario: str, release: dict, masters: dict) -> dict:
    """The notebooks of ``scenario``, keyed by notebook name, from the release and the masters
    (``{name: notebook}`` each)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}: choose from {', '.join(SCENARIOS)}")
    bases = {"reference": answers.submission(release, masters), "release": release}
    every = about(scenario).get("every_notebook")
    out = {name: copy.deepcopy(nb) for name, nb in bases[every].items()} if every else {}
    for path in sorted((FOLDER / scenario).glob("*.cells")):
        if path.stem not in release:
            raise ValueError(f"{path}: the release has no notebook {path.stem}")
        base, changes = sections(path)
        nb = copy.deepcopy(bases[base][path.stem])
        _apply(nb, changes, f"{scenario}/{path.name}")
        out[path.stem] = nb
    return dict(sorted(out.items()))


def _read(paths) -> dict:
    """``{name: notebook}`` of the notebook files ``paths``."""
    return {p.stem: nbformat.read(p, as_version=4) for p in paths}


def from_checkout(scenario: str) -> dict:
    """``scenario``'s notebooks, built from the committed release (notebooks/, which test_course
    proves is what the masters generate) and the masters, without running nbgrader."""
    from autograder import course

    return build(scenario, _read(sorted(course.NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))), _read(course.masters()))


def write(scenario: str, release_dir: Path, masters_dir: Path, folder: Path) -> list[Path]:
    """Write ``scenario``'s notebooks into ``folder`` (a student's submission folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, nb in build(scenario, _read(sorted(Path(release_dir).glob("*.ipynb"))),
                          _read(sorted(Path(masters_dir).glob("*.ipynb")))).items():
        path = folder / f"{name}.ipynb"
        nbformat.write(nb, path)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Write scenario submissions into an inbox, for ``python -m autograder collect``.

    Regenerates the course's release first (nbgrader generate_assignment). This is how the grades
    are proven at the real profile on a grading machine (the stability figures in
    autograder/README.md): write the scenarios, collect, calibrate, grade.
    """
    import argparse
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from autograder import course, release

    p = argparse.ArgumentParser(prog="python tests/scenarios.py", description=main.__doc__.split("\n\n")[0])
    p.add_argument("inbox", type=Path, help="where the per-student folders go (one per scenario)")
    p.add_argument("scenario", nargs="*", default=list(SCENARIOS),
                   help=f"scenarios to write (default: all): {', '.join(SCENARIOS)}")
    p.add_argument("--course", type=Path, default=course.COURSE_ROOT,
                   help="the course root (default: %(default)s)")
    args = p.parse_args(argv)
    unknown = sorted(set(args.scenario) - set(SCENARIOS))
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)}: choose from {', '.join(SCENARIOS)}")
    release_dir = release.generate(args.course)  # nbgrader generate_assignment: the release as students get it
    for scenario in args.scenario:
        written = write(scenario, release_dir, course.masters_dir(args.course), args.inbox / scenario)
        print(f"{scenario:16s} {len(written)} notebook(s) in {args.inbox / scenario}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
