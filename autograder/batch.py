"""What one grading batch's submissions share, and where each submission's folders lie.

:meth:`Batch.prepare` readies a batch once (the read-only copy of labsupport the sandboxes import,
the thresholds and calibration, the sandbox's and the GPU's checks, the budgets);
:class:`Folders` names one submission's folders, all in a folder of root's.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from . import course, deciding, sandbox, sandbox_disk, sandbox_memory, sandbox_users, skipping
from .course import Course

@dataclass
class Batch:
    """What every submission of one grading batch shares: sandbox, verdict settings, budgets.

    On disk, in the course root's ``sandbox/``: ``batch/`` holds the batch's own read-only files
    (the copy of labsupport the sandboxes import, the thresholds and calibration), and
    ``students/<student>/`` each submission's folders, so no student id can name the batch's.
    """

    course: Course
    timeout_s: int  # per cell
    notebook_budget_s: float  # wall clock of one notebook's kernel, and of its verdict process
    submission_budget_s: float  # wall clock of all of one submission's kernels and verdicts
    box: str | None  # why there is no sandbox (None: there is one)
    lib: Path  # the read-only copy of labsupport the sandboxes import
    settings: dict[str, str]  # the verdict spec's profile, thresholds, calibration, data
    cells: dict[str, dict[str, list[str]]]  # {notebook: {test cell: [check ids]}}
    skips: dict[str, tuple[set[str], set[str]]] = field(default_factory=dict)  # skipping.from_masters
    machine: object = None  # labsupport.hardware.Machine: the grader's own view of this machine
    memory: str | None = None  # why the sandboxes have no memory limit (None: they have one)
    disk: str | None = None  # why a submission's disk is counted by the watchdog, not a filesystem
    # the judge's workers' copy of labsupport: without the checks and partners (judge_setup.judge_only)
    worker_lib: Path | None = None

    @classmethod
    def prepare(cls, where: Course | Path, timeout_s: int) -> "Batch":
        import labsupport
        from labsupport import dataset, grading, hardware
        from labsupport.grading import judge_setup
        from labsupport.paths import data_root

        the = course.of(where)
        dataset.ensure(progress=False)  # read-only in the sandboxes: it must be there before they start
        work = the.root / "sandbox"
        sandbox_disk.unmount_below(work)  # what a grader that crashed left mounted
        shutil.rmtree(work, ignore_errors=True)
        lib = work / "batch" / "lib"
        shutil.copytree(Path(labsupport.__file__).parent, lib / "labsupport",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        worker_lib = judge_setup.worker_lab_copy(Path(labsupport.__file__).parent, work / "batch" / "worker-lib")
        spec = work / "batch" / "spec"
        spec.mkdir(parents=True)
        thresholds = spec / "thresholds.toml"
        shutil.copyfile(grading.thresholds_path(), thresholds)
        calibration = the.calibration
        if calibration.is_file():
            shutil.copyfile(calibration, spec / "calibration.toml")
        for path in [work, *work.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        settings = {"profile": os.environ.get("LAB_PROFILE", ""), "thresholds": str(thresholds),
                    "calibration": str(spec / "calibration.toml") if calibration.is_file() else None,
                    "data": str(data_root().resolve())}
        box = sandbox.problem()
        memory = box or sandbox_memory.memory_cgroup()[1]
        gpu = None if box else sandbox.gpu_problem(sandbox.Sandbox(writable=(), readable=(lib, Path(settings["data"])),
                                                                   env={"PYTHONPATH": str(lib)}))
        if gpu:
            raise course.CourseError(gpu)
        return cls(the, timeout_s, NOTEBOOK_BUDGET_CELLS * timeout_s, SUBMISSION_BUDGET_CELLS * timeout_s,
                   box, lib, settings, deciding.checks_by_cell(the), skipping.from_masters(the),
                   machine=hardware.describe_machine(hardware.pick_device()), memory=memory,
                   worker_lib=worker_lib)


# A notebook's kernel may run for this many cell time limits in all (the pre_run_cell hook that
# sleeps just under the cell limit in every cell ends there); its verdict process for as many.
NOTEBOOK_BUDGET_CELLS = 4
# All of one submission's kernels and verdict processes together: on class cpu (900 s cells) 90
# minutes, on a GPU 60, where the reference takes about a tenth of that.
SUBMISSION_BUDGET_CELLS = 6


@dataclass
class Folders:
    """One submission's folders, all in ``work`` (root's: no sandboxed process can rename or
    replace anything in it, only write inside the folders below that it was given)."""

    work: Path

    def __getattr__(self, name):
        kinds = {"results": "the kernel's results store", "run": "the kernel's Jupyter runtime folder",
                 "cwd": "the kernel's working folder", "report": "the HTML the kernel's 06 exports",
                 "inductor": "torch.compile's cache (kernels and verdict processes)",
                 "store": "the grader's results store (verdict processes)", "outbox": "verdicts",
                 "inputs": "what root hands a verdict process (root's, read-only)",
                 "judged": "what the judge keeps for later notebooks: checks, rungs, code (root's)",
                 "jupyter": "the kernel spec (root's)",
                 "connection": "the kernel's connection file (root's, mode 700: read-only in the sandbox, "
                               "where only its root, before dropping to nobody, reads it)"}
        if name not in kinds:
            raise AttributeError(name)
        return self.work / name

    def fresh(self, *names: str, owned: bool = True) -> None:
        """Make ``names`` empty again: removed (without following links) and made anew, given to
        the sandbox user where ``owned``. Safe at any time, since ``work`` is root's."""
        for name in names:
            path = getattr(self, name)
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
            if owned:
                sandbox_users.own(path)
