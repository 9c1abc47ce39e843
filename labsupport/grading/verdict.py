"""The verdict process: one notebook's graded checks, re-run by the grader outside the student's kernel.

``python -m labsupport.grading.verdict SPEC.json`` is what ``python -m autograder grade`` runs
after a notebook's kernel has finished (in the same sandbox as the kernel, where there is one),
for the notebooks the judge does not decide (:func:`.judge_setup.judges`: 02 on CUDA and 06 on
GPUs); it runs the student's code in the process that decides, which the judge never does.
What the student's kernel printed, stored or scored is not read: this process

1. takes the profile, thresholds, calibration and paths from the grader's spec (by value: the
   kernel's environment variables are not inherited);
2. imports labsupport, which binds its clocks now, before any student code runs;
3. loads the notebook's graded functions as the kernel's checks carried them forward
   (``code/<NN>.pkl``, which the grader took from the kernel into the read-only ``inputs`` folder
   and this process copies into the grader's store), and nothing else of the kernel; code that
   replaces a watched library or labsupport function while it loads fails every check;
4. runs the notebook's checks, and measures its rung of 06's ladder into the grader's store
   (:mod:`.rungs`), which 06's checks read;
5. writes the verdicts as JSON to the spec's ``out``.

The spec (JSON): ``notebook``, ``profile``, ``thresholds``, ``calibration`` (a path or null),
``store`` (the grader's results store), ``report`` (the HTML the kernel exported), ``data``,
``since`` (when the kernel started: files it wrote must be newer), ``out``, ``inputs``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    os.environ.update({"LAB_PROFILE": spec["profile"], "LAB_THRESHOLDS": spec["thresholds"],
                       "LAB_CALIBRATION": spec.get("calibration") or os.devnull,
                       "LAB_RESULTS": spec["store"], "LAB_REPORT": spec["report"], "LAB_DATA": spec["data"],
                       "LAB_WRITTEN_SINCE": str(spec["since"])})
    started = time.perf_counter()
    import labsupport  # noqa: F401  (binds the clocks and library functions it measures with, first)
    from labsupport import carry, grading, hardware
    from labsupport.grading import rungs

    number = spec["notebook"]
    _take_inputs(spec)
    lab = grading.grading_lab()
    hardware.quiet_library_logs(lab.device)  # 01's checks profile: no kineto lines in what a failure quotes
    out = {"notebook": number, "checks": {}, "rung": None, "problems": []}
    libraries = grading.library_functions()
    try:
        namespace = dict(vars(carry.load(number, lab=lab)))
    except carry.CarryError as err:
        namespace = {}
        out["problems"].append(str(err))
    patched = grading.restore_library_functions(libraries)
    tampered = grading.patched_note(patched, "when it was loaded") if patched else ""
    if tampered:
        out["problems"].append(tampered)
    found = grading.run(number, namespace, lab=lab, keep=False, tampered=tampered)
    grading.keep_checks(number, found.values())
    out["checks"] = grading.verdict_rows(found)
    if namespace and not tampered:
        try:
            rung = rungs.measure(number, namespace, lab, found)
            out["rung"] = None if rung is None else round(float(rung["samples_per_s"]), 3)
        except Exception as err:  # the student's code broke while measuring its rung: 06 says it is missing
            out["problems"].append(f"rung not measured: {type(err).__name__}: {str(err)[:300]}")
    out["seconds"] = round(time.perf_counter() - started, 2)
    Path(spec["out"]).write_text(json.dumps(out, indent=1))
    return 0


def _take_inputs(spec: dict) -> None:
    """Copy what the grader took from the kernel (``inputs``: the carried code, in a
    folder this process may only read) into the grader's store, where the checks look. Copied
    here, by this process, so the grader never writes into a folder a sandboxed process wrote."""
    import shutil

    if not spec.get("inputs"):
        return
    inputs, store = Path(spec["inputs"]), Path(spec["store"])
    judged = inputs / "judged"  # what earlier notebooks' judges kept: checks, rungs, carried code
    for path in sorted(judged.rglob("*")) if judged.is_dir() else []:
        if path.is_file() and not path.is_symlink():
            (store / path.relative_to(judged)).parent.mkdir(parents=True, exist_ok=True)
            (store / path.relative_to(judged)).unlink(missing_ok=True)
            shutil.copy2(path, store / path.relative_to(judged))
    for sub in ("code",):
        for path in sorted((inputs / sub).glob("*.pkl")):
            (store / sub).mkdir(parents=True, exist_ok=True)
            (store / sub / path.name).unlink(missing_ok=True)
            shutil.copy2(path, store / sub / path.name)  # keeps when the kernel wrote it


if __name__ == "__main__":
    code = main()
    # The verdicts are on disk: skip the interpreter's teardown of torch (about 2 s a notebook).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
