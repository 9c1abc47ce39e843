"""``benchmark``: the reference's speed and memory checks, measured N times on this machine.

Speed targets belong here, not in tests: a test asserts what grading promises (the reference
passes after ``calibrate`` on this machine, cheats fail, correctness partners hold), while this
prints what the reference achieves against each class-default bar, with its spread and margin,
for the README and the notes to quote. It runs the same graded checks ``calibrate`` runs, with
the reference's code carried forward the same way, and changes nothing on disk but its table.
"""

from __future__ import annotations

import datetime as dt
import statistics
from pathlib import Path

import pandas as pd

from . import calibrate
from .course import COURSE_ROOT, REPO_ROOT


def table(values: dict[str, list[float]], machine) -> pd.DataFrame:
    """One row per check: median, spread (min-max, IQR), the class default bar and the margin.

    The margin is how far the median clears the bar, as a ratio (above 1: clears it; for a
    "lower is better" check, bar / median). A check that is n/a on the class has no bar.
    """
    specs = calibrate.calibrated_checks()
    rows = []
    for check, vals in values.items():
        spec = specs[check]
        bar = spec.get(machine.device_class)
        median = statistics.median(vals) if vals else None
        quartiles = statistics.quantiles(vals, n=4) if len(vals) >= 2 else [median, median, median]
        margin = None
        if median is not None and isinstance(bar, (int, float)) and median > 0:
            margin = median / bar if spec["better"] == "higher" else bar / median
        rows.append({"check": check, "better": spec["better"], "runs": len(vals), "median": median,
                     "q1": quartiles[0], "q3": quartiles[-1], "min": min(vals) if vals else None,
                     "max": max(vals) if vals else None, "class default": bar, "margin": margin})
    return pd.DataFrame(rows).set_index("check")


def benchmark(runs: int = 5, course_root: Path = COURSE_ROOT, out: Path | None = None) -> tuple[Path, pd.DataFrame]:
    """Measure the reference's calibrated checks ``runs`` times; write and return the table.

    The table goes to ``build/benchmark-<device class>.txt`` (or ``out``), headed by the machine.
    """
    from labsupport.hardware import describe_machine, profile_for

    machine = describe_machine()
    values, problems = calibrate.measure(runs, course_root)
    frame = table(values, machine)
    out = Path(out) if out else REPO_ROOT / "build" / f"benchmark-{machine.device_class}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    head = (f"Reference checks, {runs} runs, {dt.datetime.now().isoformat(timespec='minutes')}: "
            f"{machine.cpu_model if machine.device == 'cpu' else machine.device_name}, class "
            f"{machine.device_class}, profile {profile_for(machine.profile).name}, "
            f"{machine.cpu_cores} cores, torch {machine.torch_version}\n\n")
    body = frame.to_string(float_format=lambda v: f"{v:.3g}")
    notes = "".join(f"\n- {p}" for p in problems)
    out.write_text(head + body + ("\n\nProblems:" + notes if notes else "") + "\n")
    return out, frame

