"""Graded checks: measure the student's code against the baseline, in a judge or a kernel, now.

One module per notebook holds its checks (``g01_profile.py`` ... ``g07_compression.py``, named after
the notebook's file); :mod:`.partners` holds the correctness partners they share. This package's
core is split by seam, and everything is importable from here (``from labsupport.grading import X``):

- :mod:`.registry`: :class:`CheckResult`, :func:`register`, the self-check :func:`table` and the
  checks tables a notebook keeps;
- :mod:`.bars`: a check's bar (:func:`bar`, the one place it is decided) and the verdict against
  it (:func:`judge`);
- :mod:`.lookup`: the student's code as a check finds it (:func:`student`, :func:`carried`);
- :mod:`.patches`: the libraries watched while the student's code is measured;
- here: :func:`grading_lab` (where the profile, thresholds and calibration are read, once),
  :func:`run`, which runs a notebook's checks, the self-check :func:`check` and :func:`fresh`.

The grading contract in code:

- A check never reads a number the student typed, printed or saved: it calls the student's
  function and measures it, through a *fresh* copy of labsupport loaded from its source files
  (:func:`fresh`), so a notebook cell that replaced ``ls.measure.compare`` changes nothing.
- Speed is a paired ratio; memory a ratio of bytes. Thresholds come per device class from
  ``labsupport/thresholds.toml``, overridden by a calibration file measured on the grading
  machine (:func:`bar`).
- Every speed or memory check has a correctness partner; a fast but wrong answer fails.
- A check that cannot apply on this device class (or at the tiny test profile) says ``n/a`` and why.

Every check returns a :class:`CheckResult`; :func:`table` shows them the way the self-check
prints them (check, measured, threshold, pass/fail). A notebook's graded cells run
``labsupport.grading.fresh().grading.run("02", globals())``.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
from dataclasses import replace
from types import ModuleType

import pandas as pd

from .. import carry, hardware, measure, notebooks
from .bars import (Bar, Bars, CheckSpec, GradedLab, GradingSetupError, bar, bars_of,  # noqa: F401
                   calibration_for, calibration_path, check_spec, check_specs, judge, lab_bar, passes,
                   reference_baseline, reference_runs, speed, threshold_for, thresholds_path)
from .lookup import StudentCodeError, carried, one_batch, process_start_s, student, written_now  # noqa: F401
from .patches import library_functions, patched_note, restore_library_functions  # noqa: F401
from .registry import (_CHECKS, BASELINE_FIGURES, REASONS, CheckResult, check_groups,  # noqa: F401
                       keep_checks, kept_checks, module_name, register, registered, table, verdict_rows,
                       with_baseline)

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # labsupport/
_fresh_ids = itertools.count()

# Set by `python -m autograder grade` in every notebook's kernel: the grader's judge measures each
# check afterwards, outside the kernel, on the code carried from it, so the kernel does not measure
# them twice (03's accuracy check alone trains for over two minutes at a real profile).
MEASURED_BY_THE_GRADER = "LAB_GRADER_MEASURES"
DEFERRED_NOTE = ("measured by the grader outside this kernel, on the code carried from here: "
                 "its table opens your feedback")


def grading_lab(bars: Bars | None = None) -> GradedLab:
    """This machine's device, description and profile, as the checks see them (seed 0), with the
    bars they are decided against: ``bars``, else read here, once, from the files ``LAB_THRESHOLDS``
    and ``LAB_CALIBRATION`` name (the profile from ``LAB_PROFILE``). The entry points make their
    lab here; nothing below reads those variables."""
    device = hardware.pick_device()
    machine = hardware.describe_machine(device)
    return GradedLab(device, machine, hardware.profile_for(machine.profile), seed=0,
                     bars=bars or Bars.from_environment())


def run(number: str, namespace: dict, *, only: tuple[str, ...] | None = None,
        skip: tuple[str, ...] = (), lab: hardware.Lab | None = None, keep: bool = True,
        tampered: str = "", sides=None) -> dict[str, CheckResult]:
    """Run notebook ``number``'s graded checks on the code in ``namespace``.

    Returns ``{check id: CheckResult}``. A check whose code raised fails with the error as its
    note; the other checks still run. ``only`` / ``skip`` select checks by id (a notebook may
    grade an expensive check where it is taught, and the rest at the end). With ``keep``, the
    notebook's graded functions, as just measured, are kept for later notebooks (:mod:`labsupport.carry`).
    ``tampered`` (why the code cannot be measured) fails every check with that note, unrun.
    ``sides`` is the grader's judge (:mod:`.judging`): the student's code and the baseline each in a
    worker of its own, passed to the checks that take it; None runs both here. In a kernel the
    grader runs (:data:`MEASURED_BY_THE_GRADER`), the checks are not measured here but "n/a", with a
    note saying where they are: the code is still carried forward, for the grader to measure.
    """
    nb = notebooks.get(number)
    checks = registered(number)
    lab = lab or grading_lab()
    out: dict[str, CheckResult] = {}
    libraries = library_functions()
    deferred = (sides is None and namespace.get("__name__") == "__main__"
                and os.environ.get(MEASURED_BY_THE_GRADER) == "1")
    for ids, fn in checks:
        if (only is not None and not set(ids) & set(only)) or set(ids) <= set(skip):
            continue
        if deferred:
            out.update({i: CheckResult(i, None, None, "", lab.machine.device_class, "n/a", DEFERRED_NOTE) for i in ids})
            continue
        try:
            if tampered:  # the code was caught bending what measures it before any check ran
                raise StudentCodeError(tampered)
            found = fn(namespace, lab) if sides is None else fn(namespace, lab, sides=sides)
        except measure.Disturbed as err:  # the side not timed ran meanwhile: nothing measured counts
            found = [CheckResult(i, None, None, "", lab.machine.device_class, "fail", str(err), reason="not measured")
                     for i in ids]
        except Exception as err:  # the student's code, whatever it raised, costs this check only
            why = f"{type(err).__name__}: {err}"
            found = [CheckResult(i, None, None, "", lab.machine.device_class, "fail", why) for i in ids]
        patched = restore_library_functions(libraries)
        if sides is not None:  # and what it replaced in its worker, where the grader's judge drives it
            patched += sides.guard()
        if patched:  # measured against a patched library (a slowed baseline, a faked clock): no verdict
            why = patched_note(patched, "while it was measured")
            found = [CheckResult(i, None, None, "", lab.machine.device_class, "fail", why) for i in ids]
        out.update({r.check: r for r in found})
    if keep and any(name in namespace for name in nb.graded):
        try:
            carry.keep(number, namespace)
        except carry.CarryError as err:
            if namespace.get("__name__") == "__main__":
                # In a notebook's kernel: later notebooks and the grader run the code carried from
                # here, so what cannot be carried fails here too, saying why, not as a zero there.
                why = f"later notebooks and the grader run your code as it is carried forward, and it cannot be: {err}"
                out = {c: replace(r, status="fail", reason="error", note=why) for c, r in out.items()}
    if keep:
        keep_checks(number, out.values())
    return out


def fresh() -> ModuleType:
    """A private copy of labsupport, loaded from its source files.

    Graded checks measure with this copy, so a notebook cell that replaced a labsupport function
    (``ls.measure.compare = ...``) cannot change what is measured.
    """
    name = f"_labsupport_graded_{next(_fresh_ids)}"
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(_PACKAGE, "__init__.py"), submodule_search_locations=[_PACKAGE])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the package's relative imports resolve through sys.modules
    spec.loader.exec_module(module)
    return module


def check(notebook: str, namespace: dict) -> pd.DataFrame:
    """The self-check: run notebook ``notebook``'s graded checks now, as the autograder will.

    Call ``ls.check("02", globals())`` in a notebook (it works in Colab, where nbgrader's Validate
    button is absent). It measures with a fresh copy of labsupport and returns the table:
    check, measured, threshold, result, note.
    """
    results = fresh().grading.run(notebook, namespace)
    return table(list(results.values()))


# The correctness partners, reachable from here (``ls.grading.same_batches``), imported only when
# asked for: a judge's worker has no partners module (:func:`.judge_setup.worker_lab_copy`).
PARTNERS = ("same_batches", "same_epoch_labels", "step_trains", "first_mismatch")


def __getattr__(name: str):
    if name in PARTNERS:
        from . import partners

        return getattr(partners, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
