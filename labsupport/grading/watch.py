"""What a graded function may not call: the grader, and the lab's own version of the task it is graded on.

The student's code runs beside labsupport (in their notebook, and in the grader's worker, which
also runs the checks' own half). So a graded function could import the grader and ask it for the
expected answers (05's ``break_even_steps`` calling the check's private helper), or hand its task
to the lab's implementation of it (01's ``measure_throughput`` as a wrapper over
``ls.measure.time_steps``), and earn points for code it did not write. :data:`RULES` declares, per
graded function, the lab code it may not call; :data:`GRADER` (``labsupport.grading``: the checks,
their partners and helpers) holds for every one. The notebooks say the same beside each function.

:func:`watched` enforces it around the calls of the student's functions that no clock times (a
timer's known workload, a diagnosis, a break-even formula on crafted cases, a loss on crafted
logits): a Python profile hook (``sys.setprofile``, and ``threading.setprofile`` for threads
started meanwhile) sees every Python function called beneath the student's, however it was
reached (an alias, ``importlib``, a ``getattr`` chain, another labsupport function in between).
What the check itself hands the function (a workload to time, batches to draw, a model) runs
beneath it and may be the grader's own code: a call beneath one of those is the check's, not the
student's. The self-check and the grader's worker call the student's functions through the same
``Here`` classes, so both watch alike. Timed calls are not watched: a hook on every Python call
would cost the student's code graded time.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
from pathlib import Path
# Bound when labsupport is imported, before any student code runs (as measure's clock is): carried
# code that later replaces sys.setprofile does not switch the watch off.
from sys import getprofile as _getprofile, setprofile as _setprofile
from threading import setprofile as _thread_setprofile

from . import StudentCodeError

_PACKAGE = Path(__file__).resolve().parent.parent  # labsupport/ (a fresh() copy: the same files)
GRADER = "labsupport.grading"

# Per graded function: the lab code it may not call (a module, or a function or class in one: its
# methods too), and what its notebook asks instead. labsupport.report builds its ladder *with* the
# student's assemble_ladder, and no other lab code computes a ladder, a diagnosis, a precision
# choice or a loss: those hold only the grader's rule. 07's quantize_int8 is not watched (exporting
# ResNet-18 makes millions of Python calls, which a profile hook would slow several times).
RULES: dict[str, tuple[tuple[str, ...], str]] = {
    "measure_throughput": (
        ("labsupport.measure.time_steps", "labsupport.measure.compare", "labsupport.measure.micro",
         "labsupport.measure.one_off_s", "labsupport.measure.cold_compile_s", "labsupport.measure.StepTimes",
         "labsupport.measure.Comparison", "labsupport.measure.Spread", "labsupport.measure.PhaseClock",
         "labsupport.measure.utilisation", "labsupport.pipeline.forever"),
        "notebook 01 asks you to write this timer yourself (warm-up, synchronisation, percentiles); of "
        "labsupport it may call ls.measure.sync, not labsupport's timers"),
    "compile_inference": (
        ("labsupport.compress.compiled", "labsupport.compress.serving"),
        "notebook 05 asks you to call torch.compile yourself, not labsupport's compiled models"),
}
WHAT_IS_ASKED = "graded code computes its answer itself: it may not call the grader"
HOOK = "sys.setprofile (the grader's watch)"


def _module_of(path: str) -> str:
    """The dotted module a file of this labsupport is (``labsupport.measure``), or "" outside it."""
    try:
        parts = Path(path).resolve().relative_to(_PACKAGE).with_suffix("").parts
    except (ValueError, OSError):
        return ""
    return ".".join(("labsupport",) + tuple(p for p in parts if p != "__init__"))


@functools.lru_cache(maxsize=None)
def _file_module(path: str) -> str:
    return _module_of(path)


def _forbidden(code: types.CodeType, name: str) -> str:
    """What ``code`` is, named as the rules name it, if graded function ``name`` may not call it ("" if it may)."""
    module = _file_module(code.co_filename)
    if not module:
        return ""
    qualname = getattr(code, "co_qualname", code.co_name)
    called = f"{module}.{qualname}".replace(".<locals>", "")
    if module == GRADER or module.startswith(GRADER + "."):
        return called
    for rule in RULES.get(name, ((), ""))[0]:
        if called == rule or called.startswith(rule + "."):
            return called
    return ""


def _codes_of(value, depth: int = 0) -> set:
    """The code objects of what a check hands a student's function: the functions, generators,
    callable objects and modules' methods beneath which the check's own code runs."""
    found = set()
    if depth > 2:
        return found
    if isinstance(value, (list, tuple)):
        for item in value[:64]:
            found |= _codes_of(item, depth + 1)
        return found
    if isinstance(value, dict):
        for item in list(value.values())[:64]:
            found |= _codes_of(item, depth + 1)
        return found
    fn = getattr(value, "__func__", value)
    if isinstance(fn, types.FunctionType):
        return {fn.__code__}
    if isinstance(value, types.GeneratorType):
        return {value.gi_code}
    import torch

    owners = [type(m) for m in value.modules()] if isinstance(value, torch.nn.Module) else [type(value)]
    for owner in owners:
        for cls in owner.__mro__:
            for attr in vars(cls).values():
                attr = getattr(attr, "__func__", attr)
                if isinstance(attr, property):
                    attr = attr.fget
                if isinstance(attr, types.FunctionType) and _file_module(attr.__code__.co_filename):
                    found.add(attr.__code__)
    return found


class _Watch:
    """A profile hook that records the first forbidden call beneath the watched call."""

    def __init__(self, name: str, given: set, base):
        self.name, self.given, self.base, self.found, self.on = name, given, base, "", True

    def __call__(self, frame, event, arg):
        if self.found or not self.on:
            return
        if event == "c_call" and arg is _setprofile:  # switching the watch off, or for another hook
            self.found = HOOK
            return
        if event != "call":
            return
        called = _forbidden(frame.f_code, self.name)
        if not called:
            return
        while frame is not None and frame is not self.base:
            if frame.f_code in self.given:
                return  # beneath what the check handed over: the check's own code
            frame = frame.f_back
        self.found = called


def _why(called: str, name: str) -> str:
    """What the notebook asks instead of calling ``called``."""
    if called == HOOK:
        return "graded code must not change the profile hook the grader watches it with"
    if called.startswith(GRADER) or name not in RULES:
        return WHAT_IS_ASKED
    return RULES[name][1]


def watched(fn, name: str, number: str, given=()):
    """``fn`` (the student's graded function ``name`` of notebook ``number``), called so that a
    call of what :data:`RULES` and :data:`GRADER` forbid it fails with a StudentCodeError naming it.
    ``given``: more of the check's own code the call may run (hooks it put on what it hands over)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        codes = set()
        for value in (*args, *kwargs.values(), *given):
            codes |= _codes_of(value)
        watch = _Watch(name, codes, sys._getframe())
        before, before_threads = _getprofile(), threading.getprofile()
        _setprofile(watch)
        _thread_setprofile(watch)
        try:
            return fn(*args, **kwargs)
        finally:  # what it called is the verdict, whatever it returned or raised afterwards
            replaced, watch.on = _getprofile() is not watch, False  # off: restoring it is no student's call
            _setprofile(before)
            _thread_setprofile(before_threads)
            called = watch.found or (HOOK if replaced else "")
            if called:
                raise StudentCodeError(f"`{name}` called {called}: {_why(called, name)} (notebook {number}'s "
                                       f"text before `{name}` says which labsupport helpers it may use)")
    return call
