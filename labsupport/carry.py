"""Your code, carried forward: what one notebook's checks measured, loaded by the notebooks after it.

Each rung of 06's ladder is measured with the student's own code: 02's loader feeds 03, 04 and 05;
03's precision choice and mixed-precision step feed 04 and 05. No cell is copied between
notebooks. Instead, when a notebook's graded checks run (its "Check your work" cell, or the
autograder running it), :func:`keep` saves the functions the checks just measured (the notebook's
``graded`` names in :mod:`labsupport.notebooks`) *by value*, with everything they use exactly as
the kernel had it: closures, module-level tensors and constants, classes, decorated helpers
(``contextmanager``, ``functools.wraps``, ``lru_cache``, ``dataclass``), partials, lambdas. It
uses cloudpickle, the library Dask, Ray and PySpark ship interactively defined functions to their
workers with. The file is ``results/code/<NN>.pkl`` (on Google Drive in Colab), with a readable
copy of its source beside it (``<NN>.py``: for you to read; nothing loads it). A later notebook
calls ``ls.carry.load("02", lab=lab)`` and gets those functions back.

Unpickling runs code, so only the student's own side loads a carried file: their kernel, and the
grader's sandboxed worker (:mod:`labsupport.grading.worker`) and verdict process. The grader's
judge and root copy its bytes and never load them. The notebook's ``lab`` (and its ``Machine``) is
never carried: the loading side's own takes its place (``persistent_id``), so carried code
measures the machine it runs on. A file is loaded by the Python and cloudpickle that wrote it
(the kernel and the grader's worker run the same environment).
"""

from __future__ import annotations

import dis
import functools
import importlib
import inspect
import io
import linecache
import pickle
import sys
import types
from pathlib import Path

import cloudpickle

from . import hardware, notebooks, results

# A carried file's largest size. The reference's largest is 02's, under 20 KB; a module-level cache
# of decoded images is what makes one big (the tiny profile's 1,000 32 px images are 3 MB as uint8,
# the real profile's 112 px ones about 150 MB), and the grader copies at most boundary.FILE_BYTES
# (64 MiB) of a file the student's side wrote.
MAX_BYTES = 32 * 2**20
READABLE = ("# A readable copy of what notebook {number} ({file}) carried forward: the source of its graded\n"
            "# functions and of the helpers they use. Later notebooks and the grader load {number}.pkl, which\n"
            "# holds them as your kernel had them (values included), not this file: editing it changes nothing.\n")


class CarryError(RuntimeError):
    """A notebook's code is missing from the results store or cannot be carried; the message says what to do."""


class NotCarried:
    """What :func:`keep` saves when a notebook's code cannot be carried: the reason, which :func:`load` raises."""

    def __init__(self, reason: str):
        self.reason = reason


def code_dir(directory: Path | None = None) -> Path:
    """Where carried code lives: ``<results>/code``."""
    return Path(directory) if directory else results.results_dir() / "code"


def _lru_cached(fn, maxsize, typed):
    """An ``functools.lru_cache`` wrapper made again where it is loaded (its cache starts empty)."""
    return functools.lru_cache(maxsize=maxsize, typed=typed)(fn)


def _importable(obj) -> bool:
    """True if pickle finds ``obj`` again by its module and name (a library's function)."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    return module is not None and module.__name__ != "__main__" \
        and getattr(module, getattr(obj, "__qualname__", ""), None) is obj


class _Pickler(cloudpickle.Pickler):
    """cloudpickle's, with the notebook's ``lab`` and machine left out, and lru_cache wrappers of the
    notebook's functions by value (pickle's own reduces them to a name no other process has)."""

    def persistent_id(self, obj):
        if isinstance(obj, hardware.Lab):
            return "lab"
        if isinstance(obj, hardware.Machine):
            return "machine"
        return None

    def reducer_override(self, obj):
        if isinstance(obj, functools._lru_cache_wrapper) and not _importable(obj):
            info = obj.cache_parameters()
            return _lru_cached, (obj.__wrapped__, info["maxsize"], info["typed"])
        if isinstance(obj, types.ModuleType) and type(obj) is not types.ModuleType \
                and sys.modules.get(obj.__name__) is obj:
            # A module of a ModuleType subclass (torch._inductor.config, which 05's reference sets):
            # by import, as cloudpickle takes plain modules (its reducers are looked up by exact type).
            return importlib.import_module, (obj.__name__,)
        return super().reducer_override(obj)


class _Unpickler(pickle.Unpickler):
    """Puts the loading side's ``lab`` where the kernel's was."""

    def __init__(self, file, lab):
        super().__init__(file)
        self.lab = lab

    def persistent_load(self, pid):
        if pid == "lab":
            return self.lab
        if pid == "machine":
            return None if self.lab is None else self.lab.machine
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def _dumps(obj) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def _global_names(code: types.CodeType) -> list[str]:
    """Names a code object (and the functions nested in it) reads as globals, in order."""
    names = [ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _global_names(const)
    return list(dict.fromkeys(names))


def _parts(obj) -> list:
    """The objects ``obj`` holds that carry may have to take along: a function's closure, defaults
    and wrapped function; a class's methods; a partial's function and arguments."""
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if isinstance(obj, (staticmethod, classmethod)):
        return [obj.__func__]
    if isinstance(obj, property):
        return [f for f in (obj.fget, obj.fset, obj.fdel) if f]
    if inspect.isclass(obj):
        return list(vars(obj).values())
    out = [obj.__wrapped__] if hasattr(obj, "__wrapped__") else []
    if inspect.isfunction(obj):
        out += [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
        out += list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
    return out


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _reached(functions: dict, namespace: dict) -> list[str]:
    """The notebook's names the graded functions use, directly or through what they use, in the
    notebook's order (the graded names themselves left out)."""
    found, seen, todo = set(), set(), list(functions.values())
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, types.ModuleType):
            continue
        seen.add(id(obj))
        if inspect.isfunction(obj) and obj.__globals__ is namespace:
            for name in _global_names(obj.__code__):
                if name in namespace and name not in found:
                    found.add(name)
                    todo.append(namespace[name])
        todo += _parts(obj)
    return [n for n in namespace if n in found and n not in functions and not n.startswith("__")]


def _what(obj) -> str:
    """``obj`` in a few words: a Tensor's dtype and shape, else its type."""
    if hasattr(obj, "shape") and hasattr(obj, "dtype"):
        return f"a {type(obj).__name__} ({obj.dtype}, shape {tuple(obj.shape)})"
    return f"a {type(obj).__name__} object"


def _why_not(functions: dict, namespace: dict, err: Exception) -> str:
    """Which name holds what cannot be carried, and what to change."""
    for name in [*_reached(functions, namespace), *functions]:
        try:
            _dumps(namespace[name])
        except Exception as inner:
            whose = "" if name in functions else " (used by your graded code)"
            return (f"{name}{whose}: {_what(namespace[name])} that cannot be carried forward "
                    f"({type(inner).__name__}: {inner}); make it inside the function that uses it")
    return f"your code cannot be carried forward ({type(err).__name__}: {err})"


def _too_big(functions: dict, namespace: dict, size: int) -> str:
    """What makes the carried code too big, largest first, and what to change."""
    sizes = []
    for name in _reached(functions, namespace):
        try:
            sizes.append((len(_dumps(namespace[name])), name))
        except Exception:
            continue
    largest = ", ".join(f"{name} holds {_what(namespace[name])} of {n / 2**20:.1f} MB"
                        for n, name in sorted(sizes, reverse=True)[:3] if n > 2**20)
    return (f"your graded code and what it uses come to {size / 2**20:.0f} MB, over the "
            f"{MAX_BYTES // 2**20} MB a notebook may carry forward{': ' + largest if largest else ''}. Build "
            "large data inside the function that uses it (decode the images when the loader is made), "
            "not in a module-level name.")


def dumps(number: str, namespace: dict) -> bytes:
    """Notebook ``number``'s graded functions in ``namespace``, pickled by value (what :func:`keep`
    writes); a :class:`CarryError` says which name holds what cannot be carried, and what to change."""
    nb = notebooks.get(number)
    functions = {n: namespace[n] for n in nb.graded if n in namespace}
    try:
        data = _dumps({"notebook": number, "functions": functions})
    except Exception as err:
        raise CarryError(_why_not(functions, namespace, err)) from None
    if len(data) > MAX_BYTES:
        raise CarryError(_too_big(functions, namespace, len(data)))
    return data


def _here(obj, namespace: dict) -> bool:
    """True for a function or class written in the notebook (through its decorators)."""
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if inspect.isfunction(obj):
        return obj.__globals__ is namespace
    return inspect.isclass(obj) and obj.__module__ in ("__main__", namespace.get("__name__"))


def _source(obj) -> str:
    """The source of a function or class written in a notebook cell (a class's from the cell that
    defines one of its name: ``inspect.getsource`` looks a class up by its module, which a kernel's
    ``__main__`` has no file for)."""
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        if not inspect.isclass(obj):
            raise
    import ast

    for filename in reversed(list(linecache.cache)):
        lines = linecache.getlines(filename)
        try:
            tree = ast.parse("".join(lines))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == obj.__name__:
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                return "".join(lines[start - 1:node.end_lineno])
    raise OSError(f"the cell that defines class {obj.__name__} was not found")


def readable(number: str, namespace: dict, problem: str = "") -> str:
    """The readable copy of notebook ``number``'s carried code: the source of its graded functions and
    of the helpers written in the notebook they use, and a line for each value carried with them."""
    import textwrap

    nb = notebooks.get(number)
    functions = {n: namespace[n] for n in nb.graded if n in namespace}
    values, sources = [], {}
    for name in [*_reached(functions, namespace), *functions]:
        obj = namespace[name]
        if isinstance(obj, types.ModuleType):
            values.append(f"#   {name}: the module {obj.__name__}")
        elif isinstance(obj, (hardware.Lab, hardware.Machine)):
            values.append(f"#   {name}: not carried; the loading notebook's own {name} takes its place")
        elif _here(obj, namespace):
            try:
                sources.setdefault(id(inspect.unwrap(obj)), textwrap.dedent(_source(obj)))
            except (OSError, TypeError):
                values.append(f"#   {name}: {_what(obj)} (its source cannot be read)")
            if getattr(obj, "__name__", name) not in (name, "<lambda>"):
                values.append(f"#   {name}: {obj.__name__}")
        else:
            values.append(f"#   {name}: {_what(obj)}" + (f" = {obj!r}" if len(repr(obj)) < 80 else ""))
    head = READABLE.format(number=number, file=nb.file)
    head += f"# NOT CARRIED: {problem}\n" if problem else ""
    head += "# Carried with them, as the kernel had them:\n" + "\n".join(values) + "\n" if values else ""
    return head + "\n\n" + "\n\n".join(s.rstrip() + "\n" for s in sources.values())


def keep(number: str, namespace: dict, directory: Path | None = None) -> Path:
    """Save notebook ``number``'s graded functions, as measured now, for later notebooks and the grader.

    Called by the graded checks after they measured the code. Writes ``<NN>.pkl`` and its readable
    copy ``<NN>.py``; returns the ``.pkl``. Code that cannot be carried is saved as the reason
    (:func:`load` raises it) and raises :class:`CarryError` here, after writing.
    """
    folder = code_dir(directory)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        data, problem = dumps(number, namespace), ""
    except CarryError as err:
        data, problem = _dumps(NotCarried(str(err))), str(err)
    path = folder / f"{number}.pkl"
    for target, content in ((folder / f"{number}.py", readable(number, namespace, problem).encode()), (path, data)):
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(content)
        tmp.replace(target)
    if problem:
        raise CarryError(problem)
    return path


def problems(number: str, namespace: dict) -> list[str]:
    """What of notebook ``number``'s graded code in ``namespace`` cannot be carried forward (empty if
    all of it can), each with what to change."""
    try:
        dumps(number, namespace)
    except CarryError as err:
        return [str(err)]
    return []


def load(number: str, *, lab=None, directory: Path | None = None) -> types.SimpleNamespace:
    """Notebook ``number``'s graded functions, as its checks last measured them.

    ``lab`` takes the place of the notebook's ``lab`` wherever the carried code used it. Raises
    :class:`CarryError` naming the notebook to run when nothing was kept, or why it was not.
    """
    nb = notebooks.get(number)
    path = code_dir(directory) / f"{number}.pkl"
    if not path.is_file():
        raise CarryError(f"Your code from {nb.file} is not in {path.parent}: run {nb.file} up to "
                         "and including its 'Check your work' cell first (in Colab, with the same "
                         "Google Drive lab folder), then run this cell again.")
    try:
        with path.open("rb") as file:
            kept = _Unpickler(file, lab).load()
    except Exception as err:
        raise CarryError(f"Your code from {nb.file} ({path}) fails to load: {type(err).__name__}: "
                         f"{err}. Fix it in {nb.file} and run its 'Check your work' cell again.") from None
    if isinstance(kept, NotCarried):
        raise CarryError(f"Your code from {nb.file} was not carried forward: {kept.reason}. Then run "
                         f"its 'Check your work' cell again.")
    if not isinstance(kept, dict) or not isinstance(kept.get("functions"), dict):
        raise CarryError(f"{path} is not code carried by {nb.file}'s checks: run that cell again.")
    return types.SimpleNamespace(**{n: f for n, f in kept["functions"].items() if n in nb.graded})
