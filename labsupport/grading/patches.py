"""The libraries a graded measurement goes through, watched while the student's code runs: a graded
function that replaces one, or swaps its code or defaults in place (to slow the baseline it is
compared with, fake a clock or bend the judge), is put back and its check gets no verdict
(:func:`library_functions`, :func:`restore_library_functions`, :func:`patched_note`)."""

from __future__ import annotations

import sys

# What the baseline, the clocks and the judge run: the module functions and the methods of the
# classes a graded measurement goes through, which the libraries themselves leave alone once
# imported, and labsupport's own modules and the classes defined in them (their partners' methods).
# (Not torch.nn.Module or the optimizers: torch.compile and torch.optim patch those on their own.)
# A graded function that replaces one, or swaps its code or defaults in place, to slow the naive
# loader or step it is compared with, fake a clock or bend the judge, fails the check it was
# measured in; carried code that does so when it is loaded fails every check of its notebook.
_LIBRARY_MODULES = ("time", "torch", "torch.nn.functional", "torch.utils.data",
                    "torchvision.transforms.v2.functional", "torchvision.io", "PIL.Image", "numpy",
                    "builtins", "json", "os")
_LIBRARY_CLASSES = (("torch", "Tensor"), ("torch.nn", "Conv2d"), ("torch.nn", "BatchNorm2d"),
                    ("torch.nn", "Linear"), ("torch.utils.data", "DataLoader"), ("PIL.Image", "Image"),
                    ("pathlib", "Path"))
# IPython rebinds these builtins itself (the last results shown), whatever the student's code does.
_REBOUND_BY_IPYTHON = {"_", "__", "___"}
_LABSUPPORT = __name__.rsplit(".", 2)[0]  # "labsupport", or a fresh() copy's private name


def _insides(value) -> tuple:
    """What a Python function runs with, besides its identity: its code and defaults (a replaced
    ``__code__`` keeps the function object, and so would pass an identity check). Closure cells
    are left out: some libraries' closures hold state that changes as they run."""
    if isinstance(value, property):
        return tuple(_insides(f) for f in (value.fget, value.fset, value.fdel))
    fn = getattr(value, "__func__", value)  # staticmethod, classmethod
    if not hasattr(fn, "__code__"):
        return ()
    return (fn.__code__, fn.__defaults__, fn.__kwdefaults__)


def _same(a: tuple, b: tuple) -> bool:
    """The same insides, object for object (defaults may hold tensors, which ``==`` cannot compare)."""
    return len(a) == len(b) and all(_same(x, y) if type(x) is tuple and type(y) is tuple else x is y
                                    for x, y in zip(a, b))


def _watched(value) -> bool:
    return callable(value) or isinstance(value, (staticmethod, classmethod, property))


def library_functions() -> dict[tuple[object, str], tuple[object, tuple]]:
    """``{(module or class, attribute): (function, its insides)}`` for the watched libraries, as they
    are now: the ones above, every module of this labsupport (its baseline, clocks, judge,
    partners) and every class defined in one (their methods and properties). The partners are
    imported first where they exist (``ls.grading`` imports them only when asked for, and a judge's
    worker has none): code that patches one as it loads is then caught like any other."""
    import importlib

    try:
        importlib.import_module(_LABSUPPORT + ".grading.partners")
    except ImportError:  # a judge's worker: no partners there to patch
        pass
    owners = [sys.modules[m] for m in _LIBRARY_MODULES if m in sys.modules]
    mine = [module for name, module in list(sys.modules.items())
            if name == _LABSUPPORT or name.startswith(_LABSUPPORT + ".")]
    owners += mine
    owners += [value for module in mine for value in list(vars(module).values())
               if isinstance(value, type) and value.__module__ == module.__name__]
    owners += [getattr(sys.modules[m], c) for m, c in _LIBRARY_CLASSES
               if m in sys.modules and hasattr(sys.modules[m], c)]
    return {(owner, name): (value, _insides(value)) for owner in owners for name, value in list(vars(owner).items())
            if _watched(value) and not (owner is sys.modules["builtins"] and name in _REBOUND_BY_IPYTHON)}


def _put_back(value, insides: tuple) -> None:
    """Give function ``value`` back the code and defaults ``insides`` recorded."""
    if isinstance(value, property):
        for f, inner in zip((value.fget, value.fset, value.fdel), insides):
            if f is not None:
                _put_back(f, inner)
        return
    fn = getattr(value, "__func__", value)
    if not insides or not hasattr(fn, "__code__"):
        return
    fn.__code__, fn.__defaults__, fn.__kwdefaults__ = insides


def restore_library_functions(before: dict[tuple[object, str], tuple[object, tuple]]) -> list[str]:
    """Put back every watched function replaced, or changed inside, since ``before``; returns their names."""
    patched = []
    for (owner, name), (value, insides) in before.items():
        now = vars(owner).get(name)
        if now is value and _same(_insides(value), insides):
            continue
        patched.append(f"{getattr(owner, '__module__', '')}.{getattr(owner, '__qualname__', owner.__name__)}"
                       f".{name}" if isinstance(owner, type) else f"{owner.__name__}.{name}")
        try:
            if now is not value:
                setattr(owner, name, value)
            _put_back(value, insides)
        except (AttributeError, TypeError, ValueError):
            pass
    return patched


def patched_note(patched: list[str], when: str) -> str:
    """Why what was measured with ``patched`` library functions in place gets no verdict (``when``:
    "when it was loaded" fails every check of the notebook, "while it was measured" the check)."""
    return (f"your code replaced {', '.join(patched[:3])} {when}: graded code must not patch "
            "libraries or labsupport (the originals are back)")

