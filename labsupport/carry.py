"""Your code, carried forward: what one notebook defined, loaded by the notebooks after it.

Each rung of 06's ladder is measured with the student's own code: 02's loader feeds 03, 04 and 05;
03's precision choice and mixed-precision step feed 04 and 05. No cell is copied between
notebooks. Instead, when a notebook's graded checks run (its "Check your work" cell, or the
autograder running it), :func:`keep` writes the source of the functions the checks just measured
(the notebook's ``graded`` names in :mod:`labsupport.notebooks`) to ``results/code/<NN>.py``,
with the imports, constants and helper functions they use. A later notebook calls
``ls.carry.load("02")`` and gets those functions back. So the code carried forward is exactly the
code that was measured, and it lives beside the results (on Google Drive in Colab).
"""

from __future__ import annotations

import ast
import dis
import importlib
import inspect
import linecache
import textwrap
import types
from pathlib import Path

from . import notebooks, results

HEADER = "# Carried forward from notebook {number} ({file}) by its graded checks: do not edit.\n"


class CarryError(RuntimeError):
    """A notebook's code is missing from the results store; the message says what to run."""


def code_dir(directory: Path | None = None) -> Path:
    """Where carried code lives: ``<results>/code``."""
    return Path(directory) if directory else results.results_dir() / "code"


def _global_names(code: types.CodeType) -> set[str]:
    """Names a code object (and the functions nested in it) reads as globals."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")
             and not (ins.argval.startswith("__") and ins.argval.endswith("__"))}  # not __name__
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _header_names(source: str) -> set[str]:
    """Names used by a def's or class's decorators, bases and defaults (evaluated where it is defined)."""
    tree = ast.parse(source)
    node = tree.body[0]
    parts = list(getattr(node, "decorator_list", []))
    if isinstance(node, ast.ClassDef):
        parts += node.bases + [k.value for k in node.keywords]
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        parts += node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
    return {n.id for part in parts for n in ast.walk(part) if isinstance(n, ast.Name)}


def _defined_here(obj, namespace: dict) -> bool:
    """True for a function or class defined in the notebook's namespace itself."""
    if inspect.isfunction(obj):
        return obj.__globals__ is namespace
    if inspect.isclass(obj):
        methods = [v for v in vars(obj).values() if inspect.isfunction(v)]
        return any(m.__globals__ is namespace for m in methods) or \
            obj.__module__ in ("__main__", namespace.get("__name__"))
    return False


def _source(obj) -> str:
    """The source of a function or class defined in the notebook.

    ``inspect.getsource`` finds a function's cell by its code's file name (IPython puts each cell
    in ``linecache``), but looks a class up by its module, ``__main__``, which in a kernel has no
    file: "could not get source code", for the helper class a student writes beside a graded
    function. A class is found instead in the cell one of its methods was compiled in, else in
    the latest cell that defines a class of its name (at its ``__firstlineno__`` where Python
    records it, 3.13+), as the ``class`` statement there, decorators included.
    """
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        if not inspect.isclass(obj):
            raise
    codes = [f.__code__ for v in vars(obj).values()
             for f in (v, getattr(v, "__func__", None), getattr(v, "fget", None)) if inspect.isfunction(f)]
    # Its methods' cells first; then every cell, latest first (a dataclass's generated methods
    # have no cell), at the class's own first line where Python records it (3.13+).
    files = [(c.co_filename, c.co_firstlineno) for c in codes]
    files += [(f, getattr(obj, "__firstlineno__", None)) for f in reversed(list(linecache.cache))]
    for filename, line in files:
        lines = linecache.getlines(filename)
        try:
            tree = ast.parse("".join(lines))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == obj.__name__ \
                    and (line is None or node.lineno <= line <= (node.end_lineno or node.lineno)):
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                return "".join(lines[start - 1:node.end_lineno])
    raise OSError(f"the cell that defines class {obj.__name__} was not found")


def _import_line(name: str, obj) -> str | None:
    """An import statement that binds ``name`` to ``obj`` again, or None if there is none."""
    if isinstance(obj, types.ModuleType):
        module = obj.__name__
        if module == name:
            return f"import {module}"
        parent, _, leaf = module.rpartition(".")
        return f"from {parent} import {leaf} as {name}" if parent else f"import {module} as {name}"
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module and qualname and "." not in qualname and "<" not in qualname:
        try:
            if getattr(importlib.import_module(module), qualname) is obj:
                return f"from {module} import {qualname}" + ("" if qualname == name else f" as {name}")
        except (ImportError, AttributeError):
            return None
    return None


def _literal(obj) -> bool:
    """True for a constant that its repr rebuilds: numbers, strings, bytes, None, and tuples, lists,
    sets and dicts of them (``SPLITS = ("train",)``, ``MEAN = [0.5, 0.5, 0.5]``)."""
    if isinstance(obj, (bool, int, float, complex, str, bytes, type(None))):
        return True
    if not isinstance(obj, (tuple, list, set, dict)):
        return False
    try:
        return ast.literal_eval(repr(obj)) == obj
    except (ValueError, SyntaxError, TypeError, RecursionError):
        return False


def source_of(names, namespace: dict) -> tuple[str, list[str]]:
    """Python source that defines ``names`` as they are in ``namespace``, and what could not be carried.

    Functions and classes defined in the notebook come with their source; the modules, library
    functions and constants (numbers, strings, dtypes, and tuples, lists, sets and dicts of them)
    they use come as imports and assignments.
    Anything else (a tensor, a model object) is listed as not carried: define it inside the function.
    """
    imports: dict[str, str] = {}
    constants: dict[str, str] = {}
    definitions: dict[str, str] = {}
    problems: list[str] = []
    todo, seen = list(names), set()
    while todo:
        name = todo.pop(0)
        if name in seen or name not in namespace:
            seen.add(name)
            continue
        seen.add(name)
        obj = namespace[name]
        if _defined_here(obj, namespace):
            try:
                source = textwrap.dedent(_source(obj))
            except (OSError, TypeError) as err:
                problems.append(f"{name}: its source cannot be read ({err})")
                continue
            definitions[name] = source + ("" if obj.__name__ == name else f"\n{name} = {obj.__name__}\n")
            codes = [obj.__code__] if inspect.isfunction(obj) else \
                [f.__code__ for v in vars(obj).values()
                 for f in (v, getattr(v, "__func__", None), getattr(v, "fget", None)) if inspect.isfunction(f)]
            used = set().union(*(_global_names(c) for c in codes)) if codes else set()
            todo += sorted((used | _header_names(source)) - seen)
        elif (line := _import_line(name, obj)) is not None:
            imports[name] = line
        elif _literal(obj) or type(obj).__name__ == "dtype":
            constants[name] = f"{name} = {obj!r}"
            if type(obj).__name__ == "dtype":
                imports.setdefault("torch", "import torch")
        elif name == "lab":
            continue  # the loading notebook's own `lab` is handed in by load()
        else:
            problems.append(f"{name}: a {type(obj).__name__} object, which later notebooks cannot "
                            "get back; create it inside the function that uses it")
    body = "\n".join(sorted(set(imports.values()))) + "\n\n" + "\n".join(constants.values())
    body += "\n\n\n" + "\n\n".join(definitions[n] for n in reversed(list(definitions)))
    return body.strip() + "\n", problems


def keep(number: str, namespace: dict, directory: Path | None = None) -> Path:
    """Write notebook ``number``'s graded functions, as measured now, for later notebooks.

    Called by the graded checks after they measured the code.
    Returns the file written. Names not carried are listed as a comment and printed.
    """
    nb = notebooks.get(number)
    source, problems = source_of([n for n in nb.graded if n in namespace], namespace)
    note = "".join(f"# not carried: {p}\n" for p in problems)
    folder = code_dir(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{number}.py"
    tmp = path.with_suffix(".py.tmp")
    tmp.write_text(HEADER.format(number=number, file=nb.file) + note + "\n" + source)
    tmp.replace(path)
    for problem in problems:
        print(f"note: your code from {nb.file} cannot be used by later notebooks as it is: {problem}")
    return path


def problems(number: str, namespace: dict) -> list[str]:
    """What of notebook ``number``'s graded code in ``namespace`` cannot be carried forward (empty
    if all of it can): the names later notebooks and the grader would not get back."""
    nb = notebooks.get(number)
    return source_of([n for n in nb.graded if n in namespace], namespace)[1]


def load(number: str, *, lab=None, directory: Path | None = None) -> types.SimpleNamespace:
    """Notebook ``number``'s graded functions, as its checks last measured them.

    ``lab`` is made available to that code as the global ``lab``. Raises :class:`CarryError`
    naming the notebook to run when nothing was kept.
    """
    nb = notebooks.get(number)
    path = code_dir(directory) / f"{number}.py"
    if not path.is_file():
        raise CarryError(f"Your code from {nb.file} is not in {path.parent}: run {nb.file} up to "
                         "and including its 'Check your work' cell first (in Colab, with the same "
                         "Google Drive lab folder), then run this cell again.")
    import labsupport

    namespace = {"__name__": f"carried_{number}", "ls": labsupport, "lab": lab}
    try:
        exec(compile(path.read_text(), str(path), "exec"), namespace)
    except Exception as err:
        raise CarryError(f"Your code from {nb.file} ({path}) fails to load: {type(err).__name__}: "
                         f"{err}. Fix it in {nb.file} and run its 'Check your work' cell again.") from None
    return types.SimpleNamespace(**{n: namespace[n] for n in nb.graded if n in namespace})
