"""The reference solutions: the masters' solution cells, executed. Instructor side only.

The answers live in one place, the masters in ``source/lab/`` (edited with nbgrader's toolbar).
``make run`` executes the masters themselves; ``calibrate`` and the tests need the reference as
functions, and get them here by executing each master's solution cells in a namespace that has
what the notebook's setup cell provides. The student distribution holds none of this.
"""

from __future__ import annotations

import copy
import linecache
import re
import types
from pathlib import Path

import nbformat

from .. import course


def namespace(notebook: str, course_root: Path = course.COURSE_ROOT,
              cell_ids: tuple[str, ...] | None = None) -> dict:
    """A namespace holding master ``notebook``'s graded solution cells (or the cells ``cell_ids``),
    executed (see :func:`execute`)."""
    master = next((p for p in course.masters(course_root) if p.name.startswith(f"{notebook}_")), None)
    if master is None:
        raise course.CourseError(f"No master notebook {notebook}_*.ipynb in the course.")
    return execute(nbformat.read(master, as_version=4), notebook, f"master {master.name}", cell_ids)


def execute(nb, notebook: str, label: str, cell_ids: tuple[str, ...] | None = None) -> dict:
    """A namespace holding notebook ``nb``'s graded solution cells (or the cells ``cell_ids``), executed.

    ``nb`` is notebook ``notebook`` ("04") of the lab: a master, or a submission (the tests grade
    scenario submissions this way); ``label`` names it in tracebacks. The graded solution cells
    are those whose id is one of the notebook's graded names in the registry
    (``labsupport.notebooks``): they define what the checks call.

    The names a notebook's setup cell provides (``ls``, ``torch``, ``F``, ``pd``, ``lab``) are
    there first, so the solutions run as they do in the notebook. Each cell's source is
    registered with ``linecache``, as IPython does, so ``inspect.getsource`` works on what it
    defines (the carried-forward code needs it).
    """
    import pandas as pd
    import torch

    import labsupport as ls
    from labsupport import grading, notebooks

    space = {"__name__": f"reference_{notebook}", "ls": ls, "torch": torch, "F": torch.nn.functional,
             "pd": pd, "lab": grading.grading_lab()}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        ids = cell_ids if cell_ids is not None else notebooks.get(notebook).graded
        wanted = cell.cell_type == "code" and cell.get("id") in ids and \
            (cell_ids is not None or meta.get("solution"))
        if wanted:
            filename = f"<{label}:{cell.get('id')}>"
            linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True), filename)
            exec(compile(cell.source, filename, "exec"), space)
    return space


def solutions(notebook: str, course_root: Path = course.COURSE_ROOT) -> types.SimpleNamespace:
    """Master ``notebook``'s graded functions (the registry's names), e.g. ``solutions("02").make_fast_loader``."""
    from labsupport import notebooks

    space = namespace(notebook, course_root)
    return types.SimpleNamespace(**{n: space[n] for n in notebooks.get(notebook).graded if n in space})


def keep_all(directory: Path | None = None, course_root: Path = course.COURSE_ROOT) -> None:
    """Keep every master's graded functions as carried-forward code in ``directory`` (default: the
    results store), as if a student had run each notebook's checks."""
    from labsupport import carry, notebooks

    for nb in notebooks.NOTEBOOKS:
        space = namespace(nb.number, course_root)
        if any(n in space for n in nb.graded):
            carry.keep(nb.number, space, directory)


SOLUTION_MARKERS = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$\n?", re.MULTILINE)


def submission(release: dict, masters: dict) -> dict:
    """The reference as a student hands it in: ``release`` (``{name: notebook}``) with every
    solution cell (code and written answers) taken from ``masters``, its markers removed."""
    out = {}
    for name, nb in release.items():
        nb = copy.deepcopy(nb)
        answers = {c.metadata["nbgrader"]["grade_id"]: c for c in masters[name].cells
                   if c.metadata.get("nbgrader", {}).get("grade_id")}
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("solution"):
                cell.source = SOLUTION_MARKERS.sub("", answers[meta["grade_id"]].source)
        out[name] = nb
    return out
