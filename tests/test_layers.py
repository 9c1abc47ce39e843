"""The layers of the code: no import cycle between files, no import running back up.

Read from the source (``ast``), every import counted, those inside functions too: a function-level
import is still a dependency, only a later one. The layers, bottom up:

- **core**: ``labsupport/*.py`` (hardware, measure, train, ladder, report, ...): the helper package
  a notebook uses. It never imports the grader (``labsupport.grading``) or the instructor's side
  (``autograder``): 06's report and the grader's rungs both sit on one module that times a rung
  (``labsupport/ladder.py``), not on each other.
- **grading**: ``labsupport/grading/``: the checks, built on the core; never ``autograder``.
- **autograder**: the instructor's commands, on top.

``labsupport/__init__.py`` (the ``ls.`` face, which imports every module) and ``__main__.py`` (a
command line) stand above the layers. An import of a module counts as an edge to that module's
file; the parent packages Python initialises on the way are not counted (every module would
otherwise depend on ``labsupport/__init__.py``, which imports them all).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("labsupport", "autograder")
ABOVE_THE_LAYERS = ("labsupport", "labsupport.__main__")  # the ls. face and the command line


def modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """``{dotted name: file}`` of every Python module under ``packages`` (in ``root``)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` (file ``path``) imports, anywhere in it."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:  # `from . import train` imports the module; `from .x import y`, x
                if f"{source}.{alias.name}" in known:
                    out.add(f"{source}.{alias.name}")
                elif source in known:
                    out.add(source)
    out.discard(name)
    return out


def graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    known = modules(root, packages)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``edges``: each strongly connected group of more than one module, sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph is a few hundred modules at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def layer(name: str) -> int | None:
    """0 core, 1 grading, 2 autograder; None above the layers."""
    if name in ABOVE_THE_LAYERS:
        return None
    if name.startswith("autograder"):
        return 2
    return 1 if name.startswith("labsupport.grading") else 0


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import from a lower layer into a higher one, as "importer -> imported"."""
    out = []
    for name, targets in sorted(edges.items()):
        for target in sorted(targets):
            here, there = layer(name), layer(target)
            if here is not None and there is not None and there > here:
                out.append(f"{name} -> {target}")
    return out


def test_no_module_imports_back_up_the_layers():
    bad = upward(graph(REPO))
    assert not bad, ("imports running back up the layers (core labsupport <- grading <- autograder): "
                     f"{bad}; move what is shared down into a core module")


def test_no_import_cycle_between_files():
    found = cycles(graph(REPO))
    assert not found, (f"import cycles between files: {found}; move what both need into a module below "
                       "them, so each file's imports point one way")


def test_the_checks_find_a_cycle_and_an_upward_import(tmp_path):
    """The two checks above can fail: a made-up package with a cycle (one side of it imported
    inside a function) and a core module that imports the grader."""
    files = {
        "labsupport/__init__.py": "from . import a\n",
        "labsupport/a.py": "from .b import thing\n",
        "labsupport/b.py": "def thing():\n    from . import a\n",
        "labsupport/c.py": "from .grading import checks\n",
        "labsupport/grading/__init__.py": "",
        "labsupport/grading/checks.py": "from .. import c\nimport autograder.slurm\n",
        "autograder/__init__.py": "",
        "autograder/cli.py": "from labsupport.grading import checks\n",
        "autograder/slurm.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    edges = graph(tmp_path)
    assert cycles(edges) == [["labsupport.a", "labsupport.b"], ["labsupport.c", "labsupport.grading.checks"]]
    assert upward(edges) == ["labsupport.c -> labsupport.grading.checks",
                             "labsupport.grading.checks -> autograder.slurm"]


def test_the_watch_rules_name_code_where_it_is_defined():
    """The grader's watch (labsupport/grading/watch.py) forbids lab code by the file it is defined
    in: a function moved to another module, though still reachable by its old name, would leave
    its rule matching nothing and the watch silently off for it."""
    from labsupport.grading import watch

    for rules, _ in watch.RULES.values():
        for rule in rules:
            module_name, _, qualname = rule.rpartition(".")
            module = importlib.import_module(module_name)
            obj = getattr(module, qualname, None)
            assert obj is not None, f"watch rule {rule}: {module_name} has no {qualname}"
            defined = inspect.getsourcefile(inspect.unwrap(obj))
            assert Path(defined).resolve() == Path(module.__file__).resolve(), \
                f"watch rule {rule}: {qualname} is defined in {defined}, where the rule does not look"

