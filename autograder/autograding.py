"""nbgrader's autograde as the grader runs it: its own Execute and SaveAutoGrades, and what a run left.

:func:`.submission.grade_student` swaps two of nbgrader's preprocessors for these:
:class:`BoundedExecute` runs the notebook (its kernel in the sandbox, its outputs capped, the
masters' demonstration cells left out: :mod:`.skipping`), and :class:`WithheldAutoGrades`
records 0 for the test cells the grader decides until the judge's verdict is recorded.
:func:`cell_errors` reads what the autograded notebook's cells raised.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat

from nbgrader.preprocessors import Execute, SaveAutoGrades
from traitlets import Bool, List

from . import kernel, skipping

# Cell outputs that mean nbgrader interrupted a cell at its time limit.
_TIMEOUT_ENAMES = {"CellTimeoutError", "KeyboardInterrupt"}


def cell_errors(autograded: Path) -> tuple[list[str], bool]:
    """Error outputs of an autograded notebook, and whether a cell hit the time limit."""
    if not autograded.exists():
        return [], False
    nb = nbformat.read(autograded, as_version=4)
    errors, timed_out = [], False
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                name = cell.metadata.get("nbgrader", {}).get("grade_id") or cell.get("id")
                errors.append(f"{name}: {out.get('ename')}: {str(out.get('evalue'))[:200]}")
                timed_out |= out.get("ename") in _TIMEOUT_ENAMES
    return errors, timed_out



class WithheldAutoGrades(SaveAutoGrades):
    """nbgrader's SaveAutoGrades, recording 0 for the test cells the grader decides (``withheld``).

    Under ``grade`` the kernel measures nothing: its check cells say "n/a, decided by the grader",
    which nbgrader would count as passed. Only the judge's verdict (:func:`deciding.record`) gives
    those points; until it has, the gradebook holds 0, in the same commit as nbgrader's own
    record of the cell, so a batch stopped between the kernel and the judge leaves no mark the
    grader did not decide (a stopped batch once left an untouched release at 10/10 for 01).
    """

    withheld = List(help="grade ids of the test cells the grader decides").tag(config=True)

    def _add_score(self, cell, resources):
        if cell.metadata["nbgrader"]["grade_id"] not in self.withheld:
            return super()._add_score(cell, resources)
        grade = self.gradebook.find_grade(cell.metadata["nbgrader"]["grade_id"], self.notebook_id,
                                          self.assignment_id, self.student_id)
        grade.auto_score = 0.0
        grade.needs_manual_grade = grade.manual_score is not None  # as nbgrader decides it
        self.gradebook.db.commit()


class BoundedExecute(Execute):
    """nbgrader's Execute, keeping at most ``max_output_bytes`` of a notebook's outputs.

    nbgrader's LimitOutput caps lines after the run; a flood of long lines (or one line) would
    still fill the notebook, the feedback and the grader's memory. Outputs beyond the cap are
    dropped as they arrive, with one line saying so.
    """

    max_output_bytes = 8 * 2**20
    skipped = List(help="ids of the cells left out of this run (skipping.to_skip), shown as skipping.WHY").tag(config=True)
    pinned_channels = Bool(False, help="the kernel is sandboxed: reach its channels through root's "
                                       "descriptors (kernel.PinnedKernelManager)").tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Here, not by config: nbgrader's Execute passes its kernel manager class as an argument,
        # which outranks the config.
        if self.pinned_channels:
            self.kernel_manager_class = kernel.PinnedKernelManager

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and cell.get("id") in self.skipped:
            self._check_assign_resources(resources)
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"[{skipping.WHY}]\n")]
            cell.execution_count = None
            return cell, self.resources
        return super().preprocess_cell(cell, resources, index)

    def output(self, outs, msg, display_id, cell_index):
        used = getattr(self, "_output_bytes", 0)
        size = len(json.dumps(msg.get("content", {}), default=str))
        self._output_bytes = used + size
        if self._output_bytes <= self.max_output_bytes:
            return super().output(outs, msg, display_id, cell_index)
        left = self.max_output_bytes - used
        if msg["msg_type"] == "stream" and left > 0:  # keep the beginning of the text that overflows
            msg["content"]["text"] = msg["content"]["text"][:left]
            super().output(outs, msg, display_id, cell_index)
        if not getattr(self, "_truncated", False):
            self._truncated = True
            outs.append(nbformat.v4.new_output("stream", name="stderr", text=(
                f"... output truncated by the grader: the notebook printed more than "
                f"{self.max_output_bytes // 2**20} MiB ...\n")))
        return None
