"""The cells a graded kernel need not run: the master's demonstrations that nothing graded reads.

Under ``grade`` the kernel measures no check (``labsupport.grading.MEASURED_BY_THE_GRADER``): the
judge measures every check, and each notebook's rung, from outside, on the code the kernel carries
forward. The demonstration cells that time, train and compile for the student to read (05's
compile modes, 07's served models, each notebook's own rung) would be measured in the kernel for
nobody. A master marks such a cell in its metadata, ``"lab": {"grader_skips": true}``, and the
grader leaves it out of the graded run, with :data:`WHY` in its place, when nothing that runs
reads a name the student's version of the cell defines: every solution cell, every cell not
marked, and every marked cell that one of those needs runs, as the student wrote it. Names are
read with :mod:`symtable` (a function's globals, not its locals); a cell that runs and cannot be
read, or reads names it does not spell (``globals()``, ``eval``, ``exec``, ``vars``, a magic),
makes the notebook run whole, and a marked cell that does either runs. The graded-checks cells pass ``globals()`` by design: nbgrader puts back their
released source before the run, and the code they carry is what the solution cells define.

Nothing here runs the notebook's code: it is parsed, not executed (root decides, before the
sandboxed kernel starts).
"""

from __future__ import annotations

import symtable
from collections.abc import Iterable

MARK = "grader_skips"
WHY = ("not run while grading: a measurement for you to read, and the grader takes its own, outside this "
       "kernel (its table opens your feedback)")
# Names through which code reads (or binds) globals it does not spell: an IPython magic (``%time
# x = f(y)``) reaches the kernel as a string to get_ipython().
DYNAMIC = frozenset({"globals", "vars", "eval", "exec", "locals", "__import__", "get_ipython"})


def from_masters(where) -> dict[str, tuple[set[str], set[str]]]:
    """``{notebook: (marked cell ids, read-only cell ids)}`` from the course's masters (root's copy)."""
    import nbformat

    from . import course

    out = {}
    for master in course.masters(course.of(where).root):
        nb = nbformat.read(master, as_version=4)
        out[master.stem] = (marked(nb), {c.id for c in nb.cells if c.metadata.get("nbgrader", {}).get("locked")})
    return out


def marked(master) -> set[str]:
    """The ids of the cells ``master`` (an nbformat notebook) marks as skipped under grade."""
    return {cell.id for cell in master.cells if cell.cell_type == "code" and cell.metadata.get("lab", {}).get(MARK)}


def names(source: str) -> tuple[set[str], set[str]]:
    """``(defines, reads)`` of one cell: the global names it binds, and the global names it or the
    functions and classes it defines read. Raises SyntaxError where it cannot be parsed."""
    from IPython.core.inputtransformer2 import TransformerManager

    table = symtable.symtable(TransformerManager().transform_cell(source), "<cell>", "exec")
    defines = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    reads = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    for scope in _nested(table):
        for s in scope.get_symbols():
            if s.is_global() and s.is_referenced():
                reads.add(s.get_name())
            if s.is_declared_global() and s.is_assigned():
                defines.add(s.get_name())
    return defines, reads


def _nested(table: symtable.SymbolTable) -> Iterable[symtable.SymbolTable]:
    for child in table.get_children():
        yield child
        yield from _nested(child)


def to_skip(notebook, marks: set[str], trusted: Iterable[str] = ()) -> set[str]:
    """The ids of the marked cells of ``notebook`` (the student's) that nothing that runs
    needs. ``trusted``: the ids of the cells nbgrader restores to their released source before the
    run (read-only cells), whose ``globals()`` is by design. Empty where any running cell cannot be
    read or reads globals it does not name, or where two cells share an id."""
    code = [(c.get("id"), c.source) for c in notebook.cells if c.cell_type == "code"]
    if len({i for i, _ in code}) < len(code):
        return set()
    found: dict[str, tuple[set[str], set[str]] | None] = {}
    for cell_id, source in code:
        try:
            found[cell_id] = names(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            if cell_id not in marks:
                return set()
            found[cell_id] = None  # a marked cell that cannot be read runs (and fails, as written)
        if cell_id in marks and found[cell_id] is not None and found[cell_id][1] & DYNAMIC:
            found[cell_id] = None  # nor one whose names cannot all be read
    trusted = set(trusted)
    skipped = {i for i, _ in code if i in marks and found[i] is not None}
    while True:
        needed: set[str] = set()
        for cell_id, _ in code:
            if cell_id in skipped or found[cell_id] is None:
                continue
            defines, reads = found[cell_id]
            if reads & DYNAMIC and cell_id not in trusted:
                return set()
            needed |= reads - defines  # what a cell binds itself (its imports) it does not need from others
        keep = {i for i in skipped if found[i][0] & needed}
        if not keep:
            return skipped
        skipped -= keep
