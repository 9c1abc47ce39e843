"""The graded checks' registry and what one check returns: :class:`CheckResult`, :func:`register`
(a ``gNN`` module's checks, by notebook), the self-check's :func:`table`, and the checks tables a
notebook keeps in its results (:func:`keep_checks`, :func:`kept_checks`)."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import pandas as pd

from .. import notebooks

_GRADING = __name__.rpartition(".")[0]  # "labsupport.grading", or a fresh() copy's private name

# What a check's result rests on (CheckResult.reason). "below bar": measured, on the wrong side of
# the bar; "incorrect": its correctness partner failed; "not optimised": the optimisation is not in
# the code; "not measured": nothing to compare; "error": the check (the student's code) raised.
REASONS = ("pass", "n/a", "below bar", "incorrect", "not optimised", "not measured", "error")


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one graded check."""

    check: str  # the check's id in thresholds.toml, e.g. "02-loader-speedup"
    measured: float | None  # what was measured just now (None if the check did not apply or ran)
    threshold: float | None  # the bar on this machine (None if not applicable)
    better: str  # "higher" or "lower"
    device_class: str  # the class whose threshold applied
    status: str  # "pass", "fail" or "n/a"
    note: str = ""  # why it failed or does not apply, including a failed correctness partner
    details: dict = field(default_factory=dict)  # what else was measured (for tables and results)
    # Why, for programs (the grader, calibrate): one of REASONS. Left empty, it follows the status
    # ("pass", "n/a"; a failure is then an "error": the check's code raised).
    reason: str = ""

    def __post_init__(self):
        if not self.reason:
            object.__setattr__(self, "reason", {"pass": "pass", "n/a": "n/a"}.get(self.status, "error"))
        if self.reason not in REASONS:
            raise ValueError(f"{self.check}: reason {self.reason!r} is not one of {REASONS}")

    @property
    def passed(self) -> bool:
        """True when the check passed or does not apply here (its points are then awarded)."""
        return self.status in ("pass", "n/a")

    def require(self) -> None:
        """Raise AssertionError saying what was measured and what to fix, unless passed."""
        if not self.passed:
            measured = "nothing" if self.measured is None else f"{self.measured:.3g}"
            bar = "" if self.threshold is None else \
                f", needs {'>=' if self.better == 'higher' else '<='} {self.threshold:.3g}"
            raise AssertionError(f"{self.check} failed on {self.device_class}: measured {measured}"
                                 f"{bar}. {self.note}")


# What a check that compares the student's code with the baseline says of the baseline's own timing
# (its details): its step (ms per timed call, :meth:`labsupport.measure.Comparison.summary`), 02's
# naive loader's data wait, and a batch's crossing from a worker. ``calibrate`` records what the
# reference's runs measured; the grader holds a pass whose baseline strays far from it for review.
BASELINE_FIGURES = ("baseline_step_ms", "baseline_wait_ms", "crossing_ms")


def with_baseline(result: CheckResult, **figures: float) -> CheckResult:
    """``result`` with the baseline's own ``figures`` (:data:`BASELINE_FIGURES`) in its details."""
    assert set(figures) <= set(BASELINE_FIGURES), figures
    return replace(result, details={**result.details, **{k: float(v) for k, v in figures.items()}})


def verdict_rows(found: dict) -> dict[str, dict]:
    """The checks of a verdict file (the judge's and a verdict process's alike): per check its
    status, reason, measurement, bar and note, whether only 06's ladder partner failed it
    (``calibrate`` still counts that measurement: nothing ran 01-05 there), and the baseline's own
    figures (:data:`BASELINE_FIGURES`)."""
    return {c: {"status": r.status, "reason": r.reason, "measured": r.measured, "threshold": r.threshold,
                "note": r.note, "ladder_only": bool(r.details.get("only_the_ladder_incomplete")),
                "baseline": {k: r.details[k] for k in BASELINE_FIGURES if k in r.details}}
            for c, r in found.items()}


_CHECKS: dict[str, list[tuple[tuple[str, ...], Callable]]] = {}


def register(*ids: str):
    """Register a check function producing the results ``ids`` for the notebook of ``ids[0]``."""
    def add(fn):
        _CHECKS.setdefault(notebooks.of(ids[0]).number, []).append((ids, fn))
        return fn
    return add


def module_name(number: str) -> str:
    """The module of notebook ``number``'s checks: ``g`` + its file's stem (``g02_data_loading``)."""
    return "g" + Path(notebooks.get(number).file).stem


def registered(number: str) -> list[tuple[tuple[str, ...], Callable]]:
    """Notebook ``number``'s check functions, with the ids each produces, in order (its module imported)."""
    importlib.import_module(f".{module_name(number)}", _GRADING)  # registers the notebook's checks
    return _CHECKS.get(number, [])


def check_groups(number: str) -> list[tuple[str, ...]]:
    """Notebook ``number``'s checks, in the groups one check function measures together, in order."""
    return [ids for ids, _ in registered(number)]


def table(results) -> pd.DataFrame:
    """The self-check table: check, measured, threshold, result."""
    results = list(results)

    def shown(r: CheckResult) -> str:
        return "" if r.threshold is None else f"{'>=' if r.better == 'higher' else '<='} {r.threshold:.3g}"

    return pd.DataFrame({
        "check": [r.check for r in results],
        "measured": ["" if r.measured is None else f"{r.measured:.3g}" for r in results],
        "threshold": [shown(r) for r in results],
        "result": [r.status.upper() for r in results],
        "note": [r.note for r in results],
    })


def keep_checks(number: str, found) -> Path:
    """Write notebook ``number``'s checks, as just measured, to ``<results>/checks/<NN>.json``: the
    table's rows and each check's reason (:data:`REASONS`). A notebook that grades its checks in
    two calls (03: the accuracy where it is taught, the rest at the end) keeps both: rows of checks
    not measured now stay."""
    from .. import results

    folder = results.results_dir() / "checks"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{number}.json"
    found = list(found)
    now = [{**row, "reason": r.reason} for row, r in zip(table(found).to_dict(orient="records"), found)]
    try:
        before = [row for row in json.loads(path.read_text()) if row["check"] not in {r.check for r in found}]
    except (OSError, ValueError, TypeError, KeyError):
        before = []
    order = [c for ids in check_groups(number) for c in ids]  # the notebook's own order
    rows = sorted(before + now, key=lambda row: order.index(row["check"]) if row["check"] in order else len(order))
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rows, indent=1))
    tmp.replace(path)
    return path


def kept_checks(directory: Path | None = None) -> pd.DataFrame:
    """Every notebook's kept checks table, one row per check, in notebook order (the results
    store reads them: :func:`labsupport.results.kept_checks`)."""
    from .. import results

    return results.kept_checks(directory)
