"""03's worker side: what a worker builds for 03's checks and may be asked (:class:`Side`), and the
steps the notebook's self-check holds in its own process (:class:`Here`). No check and no expected
answer: those are the judge's (:mod:`.g03_amp`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import torch

from .. import memory, pipeline, train
from . import StudentCodeError, one_batch, student, timed
from .rungs import Recipe, Rung, measured
from .watch import watched

PRECISIONS = ("float16", "bfloat16")  # what a request may name for a training or inference precision (None: float32)


def amp_step(fn: Callable, dtype: torch.dtype | None, channels_last: bool, device: torch.device,
             seed: int = 0, init_scale: float | None = None, compiled: bool = False) -> train.TrainStep:
    """The student's ``amp_train_step`` as the update of a fresh seeded ResNet-18 step."""
    name = str(dtype).removeprefix("torch.") if dtype is not None else None
    step = train.make_step(train.StepConfig(amp_dtype=name, channels_last=channels_last, compiled=compiled),
                           device, seed=seed, update=fn)
    if init_scale is not None:
        step.scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=dtype is torch.float16)
    return step


def precision(choose: Callable, machine) -> tuple[torch.dtype | None, bool]:
    """``(dtype, channels_last)`` from the student's ``choose_precision(machine)``, checked."""
    choice = watched(choose, "choose_precision", "03")(machine)
    try:
        dtype, channels_last = choice["dtype"], bool(choice["channels_last"])
    except (TypeError, KeyError):
        raise StudentCodeError("choose_precision must return {'dtype': ..., 'channels_last': ...}, "
                               f"not {choice!r}") from None
    if dtype not in (None, torch.float16, torch.bfloat16):
        raise StudentCodeError(f"choose_precision chose dtype {dtype!r}: use torch.float16, "
                               "torch.bfloat16 or None.")
    return dtype, channels_last


class HeldStep:
    """A training step and its batch, held where the step runs; what a check may ask of it.

    In the notebook's self-check it lives in the same process as the check (:class:`Here`); in the
    grader it lives in a worker (:mod:`.worker`) and the judge asks for each method by name,
    getting back numbers and tensors only (:data:`ASKED`).
    """

    ASKED = ("call", "weights", "names", "mark", "settle", "run", "update_at", "saved_bytes", "parity", "state")

    def __init__(self, step: train.TrainStep, batch):
        self.step = step
        self.images, self.labels = step.to_device(*batch)
        self.timed: timed.FromOneStart | None = None

    def call(self, scale: float = 1.0) -> float:
        """One step on the batch (its images times ``scale``) from the current weights: its loss."""
        return float(self.step(self.images * scale if scale != 1.0 else self.images, self.labels))

    def weights(self) -> list[torch.Tensor]:
        """Every parameter, in the model's order, as float32 copies on the CPU."""
        return [p.detach().to("cpu", torch.float32, copy=True) for p in self.step.model.parameters()]

    def names(self) -> list[str]:
        return [name for name, _ in self.step.model.named_parameters()]

    def mark(self) -> None:
        """From now on, :meth:`run` starts every call from the weights as they are now."""
        start = timed.snapshot(self.step.model)
        self.timed = timed.FromOneStart(self.step, start, (self.images, self.labels))

    def settle(self) -> None:
        self.timed.settle()

    def run(self) -> torch.Tensor:
        """One timed call: a step from the marked weights (its loss, left on the device)."""
        return self.timed.run()

    def update_at(self, seed: int) -> torch.Tensor:
        """That call's update at positions drawn from ``seed`` (chosen after the call returned)."""
        return self.timed.update_at(seed)

    def saved_bytes(self) -> int:
        """Activation bytes autograd saves for backward in one forward of the step."""
        return memory.saved_activation_bytes(lambda: self.step(self.images, self.labels), self.step.model)

    def parity(self, steps: int, batch_size: int, size: int, seed: int) -> None:
        """Train for the accuracy check (:func:`train.parity_run`, without its validation)."""
        xt, yt = pipeline.decode_once("train", size=size, progress=False)
        train.parity_run(self.step, pipeline.normalize(xt), yt, None, None, steps=steps, batch_size=batch_size,
                         seed=seed, validate=False)

    def state(self) -> list[torch.Tensor]:
        """The model's state (parameters and BatchNorm buffers, in ``state_dict`` order), on the CPU."""
        return [value.detach().cpu() for value in self.step.model.state_dict().values()]


class Here:
    """Both steps in this process (the notebook's self-check); the judge passes its own ``sides``."""

    def __init__(self, namespace: dict, lab):
        self.namespace, self.lab = namespace, lab

    def precision(self) -> tuple[torch.dtype | None, bool]:
        return precision(student(self.namespace, "choose_precision", "03"), self.lab.machine)

    def held_step(self, side: str, *, dtype: str | None = "chosen", init_scale: float | None = None,
                  batch_size: int | None = None, image_size: int | None = None) -> HeldStep:
        """fp32's step (``side="baseline"``) or the student's (``"candidate"``: in their chosen
        precision, or in ``dtype``), a fresh seeded model each, on the naive loader's first batch."""
        lab = self.lab
        batch = one_batch(lab, batch_size, image_size, augment=False)  # the same in each worker
        if side == "baseline":
            return HeldStep(train.make_step(train.StepConfig(), lab.device, seed=lab.seed), batch)
        chosen, channels_last = self.precision() if dtype == "chosen" else (
            None if dtype is None else getattr(torch, dtype), False)
        step = amp_step(student(self.namespace, "amp_train_step", "03"), chosen, channels_last, lab.device,
                        seed=lab.seed, init_scale=init_scale)
        return HeldStep(step, batch)

    def focus(self, side: str | None) -> None:
        pass

    def checking(self):
        return contextlib.nullcontext()



def chosen_precision(lab) -> dict:
    """The student's 03 ``choose_precision``, carried forward, checked: its dtype's name (None for
    float32) and channels_last, as plain data (03's and 05's workers answer it)."""
    from . import carried

    dtype, channels_last = precision(carried("03", lab).choose_precision, lab.machine)
    return {"dtype": None if dtype is None else str(dtype).removeprefix("torch."), "channels_last": channels_last}


class Side:
    """03 in a worker: fp32's step (the baseline's) or the student's (in their chosen precision, or
    in the ``dtype`` asked for), held for the judge to ask :data:`HeldStep.ASKED` of; their precision."""

    ASKED = ("held_step", "precision")

    def __init__(self, namespace: dict, lab, *, student: bool):
        self.here, self.student = Here(namespace, lab), student

    def held_step(self, *, dtype: str | None = "chosen", init_scale: float | None = None,
                  batch_size: int | None = None, image_size: int | None = None) -> HeldStep:
        if self.student and not callable(self.here.namespace.get("amp_train_step")):
            raise NameError("`amp_train_step` is not defined in the code carried from 03")
        if dtype not in ("chosen", None, *PRECISIONS):
            raise ValueError(f"no training precision {dtype!r}")
        return self.here.held_step("candidate" if self.student else "baseline", dtype=dtype, init_scale=init_scale,
                                   batch_size=batch_size, image_size=image_size)

    def precision(self) -> dict:
        if not self.student:
            raise PermissionError("the baseline's worker holds no student code (choose_precision)")
        return chosen_precision(self.here.lab)


# --- 03's rung: their loader feeding their precision choice and mixed-precision step ---------------

def their_step(code, lab, made: Recipe) -> Recipe:
    """03's change: the student's ``amp_train_step`` as the update, in their ``choose_precision``'s
    precision (in ``code("03")``)."""
    amp_code = code("03")
    dtype, channels_last = precision(student(amp_code, "choose_precision", "03"), lab.machine)
    return dataclasses.replace(made.configured(amp_dtype=dtype, channels_last=channels_last),
                               update=student(amp_code, "amp_train_step", "03"))


def _extras(found, lab) -> dict:
    accuracy = found["03-accuracy-gap"].details if "03-accuracy-gap" in found else {}
    return {"step_speedup": measured(found, "03-amp-speedup"), "activation_ratio": measured(found, "03-activation-ratio"),
            "accuracy_fp32": accuracy.get("accuracy_fp32"), "accuracy": accuracy.get("accuracy")}


RUNG = Rung(their_step, extras=_extras, in_worker=True)
