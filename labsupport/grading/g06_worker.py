"""06's worker side: what a worker builds for 06's checks and may be asked (:class:`Side`): the
naive pipeline or the student's composed one, held; their ``assemble_ladder`` on a table sent as
plain values. Both pipelines as the notebook's self-check holds them (:class:`Here`). No check
and no expected answer: those are the judge's (:mod:`.g06_report`).
"""

from __future__ import annotations

import contextlib
import numbers
import statistics

import numpy as np
import pandas as pd
import torch

from .. import pipeline, train
from . import carried, rungs, student, timed
from .watch import watched


def composed_step(lab, *, seed: int | None = None) -> tuple[train.TrainStep, object, str]:
    """The student's optimised training, composed from their own code: ``(step, loader, note)``.

    Every rung that buys speed, in ladder order, changed as the student's carried code says
    (:func:`.rungs.pipeline_recipe`; today 02's loader, 03's precision choice and mixed-precision
    step, and 05's ``COMPILE_TRAINING`` choice), at the baseline's batch: checkpointing buys
    memory, not speed, so it is not in it. The note says what a change could not do as asked
    (no compile choice kept from 05: not compiled).
    """
    made = rungs.pipeline_recipe(lambda n: vars(carried(n, lab)), lab)
    loader, step = made.build(lab, seed=seed)
    return step, loader, "; ".join(made.notes)


class HeldPipeline:
    """One side of 06's end-to-end comparison, held where it runs: a training step fed by its loader,
    every timed call one step from the same start on the loader's next batch
    (:class:`timed.FromOneStart`). The baseline is the lab's fp32 step on the naive loader; the
    candidate is the student's composed pipeline (:func:`composed_step`), which keeps the batches
    its timed calls trained on. The self-check holds both here (:class:`Here`); the grader's judge
    holds each in a worker of its own and asks for :data:`ASKED` by name, getting numbers and
    tensors back (:mod:`.judging`)."""

    ASKED = ("describe", "fetch", "call", "weights", "names", "settle", "run", "update_at", "kept",
             "skipped", "wait_ms")

    def __init__(self, step: train.TrainStep, batches: pipeline.forever, start: dict[str, torch.Tensor], *,
                 seed: int, keep: bool, non_blocking: bool, note: str = ""):
        self.step, self.batches, self.note, self.batch = step, batches, note, None
        self._non_blocking = non_blocking
        self.timed = timed.FromOneStart(step, start, self._next, seed=seed, keep=keep)

    def _next(self):
        return self.step.to_device(*next(self.batches), self._non_blocking)

    def describe(self) -> str:
        """What the step is, for the check's note (a description only: the partners decide)."""
        config = self.step.config
        return (f"{config.amp_dtype or 'float32'}, channels_last={config.channels_last}, "
                f"compiled={config.compiled}" + (f" ({self.note})" if self.note else ""))

    def fetch(self) -> torch.Tensor:
        """Take the loader's next batch for :meth:`call`; its labels (their count is the batch size)."""
        self.batch = self._next()
        return self.batch[1]

    def call(self, scale: float = 1.0) -> float:
        """One step on the fetched batch from the current weights: its loss."""
        images, labels = self.batch
        return float(self.step(images * scale if scale != 1.0 else images, labels))

    def weights(self) -> list[torch.Tensor]:
        return [p.detach().to("cpu", torch.float32, copy=True) for p in self.step.model.parameters()]

    def names(self) -> list[str]:
        return [name for name, _ in self.step.model.named_parameters()]

    def settle(self) -> None:
        self.timed.settle()

    def run(self) -> torch.Tensor:
        """One timed call: a step from the start on the loader's next batch (its loss, on the device)."""
        return self.timed.run()

    def update_at(self, seed: int) -> torch.Tensor:
        return self.timed.update_at(seed)

    def kept(self, index: int) -> list[torch.Tensor]:
        """The batch timed call ``index`` trained on: float32 images in the standard layout, labels."""
        images, labels = self.timed.calls[int(index)].batch
        return [images.float().contiguous(), labels]

    def skipped(self) -> list[bool]:
        """For each timed call: whether a float16 GradScaler skipped its update (its scale fell)."""
        return [call.scale is not None and not bool(call.scale[1] >= call.scale[0]) for call in self.timed.calls]

    def wait_ms(self) -> float:
        """The median time the step waited for the loader's next batch (the pipeline's own count)."""
        waits = self.batches.waits_ms or [float("nan")]
        return float(statistics.median(waits))


def fp32_start(lab) -> dict[str, torch.Tensor]:
    """The weights every timed call of either side starts from: the lab's seeded fp32 ResNet-18's."""
    return timed.snapshot(train.make_step(train.StepConfig(), lab.device, seed=lab.seed).model)


class Here:
    """Both pipelines and the student's ``assemble_ladder`` in this process (the notebook's
    self-check); the grader's judge passes its own ``sides``, each side in a worker."""

    def __init__(self, namespace: dict, lab):
        self.namespace, self.lab = namespace, lab

    def assemble_ladder(self, frame: pd.DataFrame):
        return watched(student(self.namespace, "assemble_ladder", "06"), "assemble_ladder", "06")(frame)

    def pipeline(self, side: str) -> HeldPipeline:
        """The naive pipeline (``side="baseline"``) or the student's composed one (``"candidate"``)."""
        lab = self.lab
        if side == "baseline":  # the ladder's baseline: the naive loader feeding the lab's fp32 step
            loader, step = rungs.Recipe().build(lab)
            return HeldPipeline(step, pipeline.forever(loader), timed.snapshot(step.model), seed=lab.seed,
                                keep=False, non_blocking=False)
        step, loader, note = composed_step(lab)
        return HeldPipeline(step, pipeline.forever(loader, timed=True), fp32_start(lab), seed=lab.seed,
                            keep=True, non_blocking=True, note=note)

    def focus(self, side: str | None) -> None:
        pass

    def checking(self):
        return contextlib.nullcontext()


def table_message(frame: pd.DataFrame, rows: int = 64, columns: int = 32) -> dict:
    """``frame`` as plain JSON for the wire: its index, its column labels and each column's values
    as numbers, None or text (at most ``rows`` x ``columns``; other values as text of at most 80
    characters)."""
    def plain(value):
        if value is None or isinstance(value, (bool, np.bool_)):
            return None if value is None else bool(value)
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real):
            return float(value)
        return str(value)[:80]

    frame = frame.iloc[:rows, :columns]
    return {"index": [plain(i) for i in frame.index], "columns": [plain(c) for c in frame.columns],
            "data": [[plain(v) for v in frame.iloc[:, j].tolist()] for j in range(frame.shape[1])]}


def table_from(message) -> pd.DataFrame:
    """The DataFrame :func:`table_message` described (ValueError if it is not one)."""
    try:
        index, columns, data = message["index"], message["columns"], message["data"]
        if not (isinstance(index, list) and isinstance(columns, list) and isinstance(data, list)
                and len(columns) == len(data) and all(isinstance(d, list) and len(d) == len(index) for d in data)
                and all(isinstance(v, (str, float, int, type(None))) for d in [index, columns, *data] for v in d)):
            raise TypeError
    except (TypeError, KeyError):
        raise ValueError("not a table") from None
    labels = pd.Index(index, dtype=object).infer_objects()
    frame = pd.DataFrame({j: pd.Series(d, dtype=object).infer_objects() for j, d in enumerate(data)})
    if frame.shape[1]:
        frame.index = labels
    else:
        frame = pd.DataFrame(index=labels)
    frame.columns = columns
    return frame




class Side:
    """06 in a worker: the naive pipeline (the baseline's) or the student's composed one, held for
    the judge to ask :data:`HeldPipeline.ASKED` of; the student's ``assemble_ladder``."""

    ASKED = ("pipeline", "assemble")

    def __init__(self, namespace: dict, lab, *, student: bool):
        self.here, self.student = Here(namespace, lab), student

    def pipeline(self) -> HeldPipeline:
        return self.here.pipeline("candidate" if self.student else "baseline")

    def assemble(self, *, frame=None) -> dict:
        """The student's ``assemble_ladder`` on the table sent, its table as plain values."""
        if not self.student:
            raise PermissionError("the baseline's worker holds no student code (assemble_ladder)")
        student(self.here.namespace, "assemble_ladder", "06")
        table = self.here.assemble_ladder(table_from(frame))
        if not isinstance(table, pd.DataFrame):
            return {"type": type(table).__name__}
        return {"table": table_message(table)}
