"""``run`` (``make run``): execute the reference notebooks (01-08) in order and export the report.

A speed or memory bar the reference misses on this machine is printed with its measurement and
the advice to calibrate: information, not a failed run. Anything else that broke (an exception,
a failed correctness partner, a missing stage) fails the run.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import nbformat

from .course import CourseError, environment, ipc_kernel_manager, masters, shown

def bar_check(message: str) -> str | None:
    """The check id of a failed graded assertion that is a bar the machine decides (a speed or memory
    ratio that ``calibrate`` adjusts), or None for anything else (a failed correctness partner, an
    optimisation not in the code, a missing stage, a count). Parses ``CheckResult.require``'s
    message: "<check> failed on ...". Used by: run and the master-validation test."""
    from labsupport import grading

    check = message.split(" failed on ", 1)[0].strip()
    spec = tomllib.loads(grading.thresholds_path().read_text()).get("checks", {}).get(check, {})
    # A failed correctness partner, and an optimisation that is plainly absent (05: Dynamo captured
    # no graph), are broken code. 02's "not optimised" is a timing (the wait did not halve against
    # the naive loader's, measured now), as machine-dependent as the bar itself.
    if not spec.get("calibrate") or "correctness check failed" in message or "captured no graph" in message \
            or "runs the model eagerly" in message:
        return None
    return check



def run_reference(course_root: Path, build: Path, *, timeout_s: int = 900) -> tuple[Path, list[dict]]:
    """Execute the masters (the reference solutions) headless, in order, in ``build/run``.

    The notebooks share one results store, as a student's do, so 06 reads what 01-05 measured on
    this machine; 06 exports the report to ``build/report.html``. Executed copies are kept in
    ``build/run`` for reading. A speed or memory bar the reference misses on this machine is
    information, not a failure: it is returned (check, notebook, message) for the caller to print.
    Anything else that raised (an exception, a failed correctness partner, a missing stage)
    raises CourseError after all the notebooks ran. Returns the report's path and the misses.
    Used by: ``make run``.
    """
    import time

    from nbclient import NotebookClient
    from tqdm.auto import tqdm

    build = Path(build).resolve()
    run_dir = build / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    report = build / "report.html"
    env = {"LAB_RESULTS": str(run_dir / "results"), "LAB_REPORT": str(report)}
    failures, misses, times = [], [], {}
    with environment(env):
        for master in tqdm(masters(course_root), desc="reference notebooks", unit="notebook"):
            nb = nbformat.read(master, as_version=4)
            nbformat.write(nb, run_dir / master.name)  # beside the kernel, as a student's is (06 reads its analysis)
            started = time.perf_counter()
            # The kernel's own stderr (C++ libraries' logging: kineto's USDT lines, "gpuGetDeviceCount
            # failed" on a machine without a GPU) goes to a log file beside the executed notebook,
            # not to the terminal, where a newcomer would read it as a fault.
            with ipc_kernel_manager() as km, open(run_dir / f"{master.stem}.kernel.log", "w") as log:
                NotebookClient(nb, km=km, timeout=timeout_s, allow_errors=True,
                               resources={"metadata": {"path": str(run_dir)}}).execute(stderr=log, stdout=log)
            times[master.name] = time.perf_counter() - started
            nbformat.write(nb, run_dir / master.name)
            for cell in nb.cells:
                graded = cell.metadata.get("nbgrader", {}).get("grade")
                for out in cell.get("outputs", []):
                    if out.get("output_type") != "error":
                        continue
                    check = bar_check(out["evalue"]) if graded and out["ename"] == "AssertionError" else None
                    if check:
                        misses.append({"notebook": master.name, "check": check, "message": out["evalue"][:300]})
                    else:
                        failures.append(f"{master.name}, cell {cell.get('id')}: {out['ename']}: {out['evalue'][:300]}")
    for name, seconds in times.items():
        print(f"{name:28s} {seconds:6.0f} s")
    if failures:
        raise CourseError("the reference notebooks raised (executed copies in "
                          f"{shown(run_dir)}):\n" + "\n".join(failures))
    return report, misses
