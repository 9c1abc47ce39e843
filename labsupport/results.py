"""The results store: every measurement the lab records, as one JSON file per stage.

A stage is named ``<notebook number>-<what>``, e.g. ``01-baseline`` or ``03-amp``. Each file holds
the metrics with the configuration and the machine description they were measured with, so the
report in notebook 06 can say what ran where, and refuse numbers from another machine.
Files live in ``./results`` (the folder a notebook runs in), or in ``LAB_RESULTS``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from pathlib import Path

import pandas as pd

SCHEMA_VERSION = 1

class ResultsError(RuntimeError):
    """A stage's results are missing or unreadable; the message says which notebook to run."""


def results_dir() -> Path:
    """Where results are kept: ``LAB_RESULTS``, the lab folder's ``results/`` or ``./results``
    (:func:`labsupport.paths.results_dir`;"""
    from .paths import results_dir as where

    return where()


def notebook_for(stage: str) -> str:
    """The notebook that records ``stage``, from its number prefix (the registry in notebooks.py)."""
    from . import notebooks

    try:
        return notebooks.of(stage).file
    except ValueError:
        return f"the notebook numbered {stage.split('-', 1)[0]!r}"


def _jsonable(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "item"):  # numpy and 0-d torch scalars
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"Cannot store {type(value).__name__} in results: convert it to a number, "
                    "string, list or dict first.")


def record(stage: str, metrics: dict, *, config=None, machine=None, profile=None,
           directory: Path | None = None) -> Path:
    """Save ``metrics`` under ``stage`` with config, profile and machine.

    Overwrites an earlier record of the same stage: the latest run is the one that counts.
    """
    if not re.fullmatch(r"\d\d-[a-z0-9][a-z0-9_.-]*", stage):
        raise ValueError(f"Stage name {stage!r}: use '<notebook number>-<name>', e.g. '01-baseline'.")
    if machine is None:
        from .hardware import describe_machine
        machine = describe_machine()
    payload = {
        "schema": SCHEMA_VERSION,
        "stage": stage,
        "notebook": notebook_for(stage),
        "recorded_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "metrics": metrics,
        "config": config,
        "profile": profile,
        "machine": machine,
    }
    folder = Path(directory) if directory else results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stage}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=_jsonable))
    tmp.replace(path)  # atomic: a crash mid-write never leaves a half file behind
    return path


def load(stage: str, directory: Path | None = None) -> dict:
    """One stage's record; a clear error naming the notebook if it is missing."""
    folder = Path(directory) if directory else results_dir()
    path = folder / f"{stage}.json"
    if not path.exists():
        raise ResultsError(f"No results for stage '{stage}' ({path} does not exist). "
                           f"Run {notebook_for(stage)} top to bottom to record it.")
    try:
        payload = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ResultsError(f"{path} is not readable JSON ({err}). Delete it and run "
                           f"{notebook_for(stage)} again to re-record stage '{stage}'.") from None
    missing = {"schema", "stage", "metrics", "machine"} - set(payload if isinstance(payload, dict) else ())
    if missing or payload.get("schema") != SCHEMA_VERSION:
        raise ResultsError(f"{path} is not a results file of schema {SCHEMA_VERSION} "
                           f"(missing {sorted(missing) or 'nothing'}, schema "
                           f"{payload.get('schema') if isinstance(payload, dict) else '?'}). "
                           f"Delete it and run {notebook_for(stage)} again.")
    wrong = [k for k in ("metrics", "machine") if not isinstance(payload[k], dict)]
    wrong += [k for k in ("config", "profile") if not isinstance(payload.get(k) or {}, dict)]
    if wrong:
        raise ResultsError(f"{path}: {', '.join(wrong)} must be a JSON object. Delete it and run "
                           f"{notebook_for(stage)} again to re-record stage '{stage}'.")
    return payload


def stages(directory: Path | None = None) -> list[str]:
    """Names of the stages recorded so far, in notebook order."""
    folder = Path(directory) if directory else results_dir()
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def load_all(directory: Path | None = None, required: list[str] | tuple[str, ...] = ()) -> pd.DataFrame:
    """Every recorded stage as one row, metrics as columns.

    Columns: ``stage``, ``notebook``, ``recorded_at``, ``device_class``, ``device_name``, then
    one column per metric. ``required`` stages that are missing raise one error listing them all.
    """
    missing = [s for s in required if s not in stages(directory)]
    if missing:
        raise ResultsError("Missing results: " + "; ".join(
            f"'{s}' (run {notebook_for(s)})" for s in missing))
    rows = []
    for stage in stages(directory):
        rec = load(stage, directory)
        machine = rec.get("machine") or {}
        rows.append({"stage": stage, "notebook": rec.get("notebook"),
                     "recorded_at": rec.get("recorded_at"),
                     "device_class": machine.get("device_class"),
                     "device_name": machine.get("device_name"), **rec["metrics"]})
    return pd.DataFrame(rows, columns=None if rows else
                        ["stage", "notebook", "recorded_at", "device_class", "device_name"])


def kept_checks(directory: Path | None = None) -> pd.DataFrame:
    """Every notebook's kept checks table (``<results>/checks/<NN>.json``, written by the self-check
    and the grader: :func:`labsupport.grading.keep_checks`), one row per check, in notebook order;
    an unreadable table is left out, not raised (the report shows the others)."""
    folder = Path(directory) if directory else results_dir()
    rows = []
    for path in sorted((folder / "checks").glob("*.json")):
        try:
            rows += json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return pd.DataFrame(rows, columns=["check", "measured", "threshold", "result", "note"])
