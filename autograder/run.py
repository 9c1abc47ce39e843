"""``run`` (``make run``): execute the reference notebooks (01-08) in order and export the report.

A speed or memory bar the reference misses on this machine is printed with its measurement and
the advice to calibrate: information, not a failed run. Anything else that broke (an exception,
a failed correctness partner, a missing stage) fails the run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat

from . import course, headless, stopping
from .course import CourseError, declared_checks, environment, graded_test_cells, shown


def bar_missed(check: str, reason: str) -> bool:
    """Whether a failed check is a bar this machine decides: a speed or memory ratio that
    ``calibrate`` adjusts, measured on the wrong side of its bar (reason "below bar"). A failed
    correctness partner, an optimisation not in the code, nothing measured or an error is broken
    code, never a miss."""
    from labsupport import grading

    spec = grading.check_specs().get(check)
    return spec is not None and spec.calibrate and reason == "below bar"


def _kept_reasons(results: Path, number: str) -> dict[str, dict]:
    """``{check: kept row}`` of notebook ``number``'s checks as its kernel kept them (reasons included)."""
    import json

    try:
        return {row["check"]: row for row in json.loads((results / "checks" / f"{number}.json").read_text())}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def outcomes(nb, notebook: str, kept: dict[str, dict]) -> tuple[list[dict], list[str]]:
    """What an executed master raised: ``(misses, failures)``. A graded test cell that failed on
    bars this machine decides (:func:`bar_missed`, by the reasons its kernel kept), and on nothing
    else, is a miss per check; any other error is a failure."""
    misses, failures = [], []
    graded = {id(cell) for cell in graded_test_cells(nb)}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") != "error":
                continue
            failed = [c for c in declared_checks(cell, notebook) if c in kept and kept[c].get("result") == "FAIL"] \
                if id(cell) in graded and out["ename"] == "AssertionError" else []
            if failed and all(bar_missed(c, kept[c].get("reason", "")) for c in failed):
                misses += [{"notebook": f"{notebook}.ipynb", "check": c, "message": out["evalue"][:300]} for c in failed]
            else:
                failures.append(f"{notebook}.ipynb, cell {cell.get('id')}: {out['ename']}: {out['evalue'][:300]}")
    return misses, failures


def run_reference(where: course.Course | Path, build: Path, *, timeout_s: int = 900) -> tuple[Path, list[dict]]:
    """Execute the masters (the reference solutions) headless, in order, in ``build/run``.

    The notebooks share one results store, as a student's do, so 06 reads what 01-05 measured on
    this machine; 06 exports the report to ``build/report.html``. Executed copies are kept in
    ``build/run`` for reading. A speed or memory bar the reference misses on this machine is
    information, not a failure: it is returned (check, notebook, message) for the caller to print.
    Anything else that raised (an exception, a failed correctness partner, a missing stage)
    raises CourseError after all the notebooks ran. Returns the report's path and the misses.
    """
    import time

    from tqdm.auto import tqdm

    build = Path(build).resolve()
    run_dir = build / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    report = build / "report.html"
    env = {"LAB_RESULTS": str(run_dir / "results"), "LAB_REPORT": str(report)}
    failures, misses, ran = [], [], {}
    # One kernel at a time: each ends (with its workers) before the next starts, and on Ctrl-C or
    # SIGTERM before run exits. The run's peak: this process and its kernel together.
    with environment(env), stopping.on_signals(), headless.TreePeak(os.getpid()) as whole:
        for master in tqdm(course.masters(course.of(where).root), desc="reference notebooks", unit="notebook"):
            nb = nbformat.read(master, as_version=4)
            nbformat.write(nb, run_dir / master.name)  # beside the kernel, as a student's is (06 reads its analysis)
            started = time.perf_counter()
            # The kernel's own stderr (C++ libraries' logging: kineto's USDT lines, "gpuGetDeviceCount
            # failed" on a machine without a GPU) goes to a log file beside the executed notebook,
            # not to the terminal, where a newcomer would read it as a fault.
            with open(run_dir / f"{master.stem}.kernel.log", "w") as log:
                peak_bytes = headless.execute(nb, run_dir, timeout_s=timeout_s, allow_errors=True, log=log)
            ran[master.name] = (time.perf_counter() - started, peak_bytes)
            tqdm.write(f"ran {master.name} in {ran[master.name][0]:.0f} s, peak {peak_bytes / 2**30:.2f} GiB")
            nbformat.write(nb, run_dir / master.name)
            missed, failed = outcomes(nb, master.stem, _kept_reasons(run_dir / "results", master.stem[:2]))
            misses += missed
            failures += failed
    print(f"{'notebook':28s} {'time':>8s} {'peak memory':>12s} (its kernel and the processes it started)")
    for name, (seconds, peak_bytes) in ran.items():
        print(f"{name:28s} {seconds:6.0f} s {peak_bytes / 2**30:8.2f} GiB")
    print(f"{'the run at its peak':28s} {'':8s} {whole.peak_bytes / 2**30:8.2f} GiB (run and its kernel together)")
    if failures:
        raise CourseError("the reference notebooks raised (executed copies in "
                          f"{shown(run_dir)}):\n" + "\n".join(failures))
    return report, misses
