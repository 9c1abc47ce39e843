"""04's worker side: what a worker builds for 04's checks and may be asked (:class:`Side`), and the
steps the notebook's self-check holds in its own process (:class:`Here`). No check and no expected
answer: those are the judge's (:mod:`.g04_checkpointing`).
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.nn.functional as F

from .. import memory, train
from . import StudentCodeError, one_batch, student, timed
from .rungs import Recipe, Rung, measured
from .watch import watched

# The parts of training memory the student's ``training_bytes`` returns, in bytes (04, section 6).
TRAINING_PARTS = ("weights", "gradients", "optimizer state")


def segments_of(namespace) -> int:
    """The student's ``SEGMENTS``, checked to be a whole number of ResNet-18's 9 body units."""
    segments = namespace.get("SEGMENTS")
    if not isinstance(segments, int) or not 1 <= segments <= 9:
        raise StudentCodeError(f"SEGMENTS = {segments!r}: set it to the number of checkpointed segments "
                               "you chose, from 1 to 9 (ResNet-18's body has 9 units).")
    return segments


class HeldCheckpoint:
    """A training step of 04 and its batch, held where the step runs; what a check may ask of it.

    The baseline is the lab's plain fp32 step; the candidate the same seeded network wrapped by
    the student's ``checkpointed(model, SEGMENTS)``. ``images`` is the naive loader's first batch
    at twice the profile's batch size (unaugmented: the same in every process); its first half is
    the small batch the checks compare on. The self-check holds both here (:class:`Here`); the
    grader's judge holds each in a worker and asks for :data:`ASKED` by name (:mod:`.judging`).
    """

    ASKED = ("gradients", "statistics", "forward_bytes", "warm", "peak", "mark", "untimed_convolutions", "run",
             "update_at", "convolutions", "names")

    def __init__(self, step: train.TrainStep, images: torch.Tensor, labels: torch.Tensor, batch: int, lab):
        self.step, self.lab = step, lab
        self.images, self.labels = images.to(lab.device), labels.to(lab.device)
        self.small = self.images[:batch], self.labels[:batch]
        self.timed: timed.FromOneStart | None = None
        self._stats: list[torch.Tensor] = []

    def gradients(self) -> list[torch.Tensor]:
        """One backward on the small batch (float32 arithmetic): every parameter's gradient, on
        the CPU; the BatchNorm running statistics it left are kept for :meth:`statistics`."""
        with train.exact_fp32():  # no TF32: a float32 tolerance must mean float32 arithmetic
            grads, self._stats = train.grads_and_stats(self.step.net, self.step.model, *self.small)
        return [g.detach().cpu() for g in grads]

    def statistics(self) -> list[torch.Tensor]:
        return [s.detach().cpu() for s in self._stats]

    def forward_bytes(self) -> int:
        """Bytes a forward and loss on the small batch hold for backward (:func:`memory.forward_bytes`)."""
        x, y = self.small
        return int(memory.forward_bytes(lambda: F.cross_entropy(self.step.net(x), y), self.lab.device))

    def warm(self) -> None:
        """One step: the optimizer's state exists before peaks are measured."""
        self.step(*self.small)

    def peak(self, double: bool = False) -> list[float]:
        """A step's peak bytes on the small batch (or the doubled one): ``[tensors counted,
        the allocator's peak (:func:`memory.peak_step_bytes`) or -1]``."""
        x, y = (self.images, self.labels) if double else self.small
        report = memory.peak_step_bytes(lambda: self.step(x, y), self.lab.device, cpu_allocator=True)
        return [float(report.peak_bytes), float(-1 if report.allocator_peak_bytes is None else report.allocator_peak_bytes)]

    def mark(self) -> None:
        """From now on every call (:meth:`run`) starts from the lab's seeded fp32 weights, on the small
        batch, its convolutions counted (the recomputation's included)."""
        start = timed.snapshot(train.build_model(seed=self.lab.seed))
        self.timed = timed.FromOneStart(self.step, start, self.small, seed=self.lab.seed, count_convolutions=True)

    def untimed_convolutions(self) -> int:
        """Convolutions one call runs, counted on a call no clock watches (then forgotten)."""
        self.timed()
        return self.timed.calls.pop().convolutions

    def run(self) -> torch.Tensor:
        return self.timed.run()

    def update_at(self, seed: int) -> torch.Tensor:
        return self.timed.update_at(seed)

    def convolutions(self) -> list[int]:
        """Convolutions each call since :meth:`mark` ran (the worker's count, where it runs in one)."""
        return [int(call.convolutions) for call in self.timed.calls]

    def names(self) -> list[str]:
        return [name for name, _ in self.step.model.named_parameters()]


class HeldAccumulation:
    """The student's ``accumulate_step`` after one call on the lab's GroupNorm ResNet-18 (``k``
    uneven micro-batches of the doubled batch, float32 arithmetic): what a check may ask of it."""

    ASKED = ("gradients", "weights", "seen", "loss", "micro_peak")

    def __init__(self, step_fn, lab, images: torch.Tensor, labels: torch.Tensor, k: int, lr: float):
        self.step_fn, self.lab, self.lr = step_fn, lab, lr
        self.images, self.labels = images.to(lab.device), labels.to(lab.device)
        self.model = train.group_norm_resnet(lab.seed).to(lab.device)
        optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)
        self._seen: list[int] = []  # the batch of every forward call: the micro-batches the model saw
        hook = self.model.register_forward_pre_hook(lambda module, args: self._seen.append(int(args[0].shape[0])))
        with train.exact_fp32():
            self._loss = step_fn(self.model, optimizer, self.images, self.labels, k)
        hook.remove()

    def gradients(self) -> list[torch.Tensor]:
        return [p.grad.detach().cpu() if p.grad is not None else torch.zeros_like(p, device="cpu")
                for p in self.model.parameters()]

    def weights(self) -> list[torch.Tensor]:
        return [p.detach().cpu() for p in self.model.parameters()]

    def seen(self) -> list[int]:
        return list(self._seen)

    def loss(self) -> float:
        return float(torch.as_tensor(self._loss).float().mean()) if self._loss is not None else float("nan")

    def micro_peak(self, micro: int = 4) -> list[float]:
        """The student's step's peak bytes with ``micro`` micro-batches, on a fresh network after a
        warm-up step: ``[tensors counted, the CPU allocator's peak or -1]`` (:func:`step_peak`)."""
        return [float(v) for v in step_peak(lambda net, opt: self.step_fn(net, opt, self.images, self.labels,
                                                                        int(micro)), self.lab, self.lr)]


class Here:
    """Both 04 steps and the student's accumulation in this process (the notebook's self-check);
    the grader's judge passes its own ``sides``, each side in a worker."""

    def __init__(self, namespace: dict, lab):
        self.namespace, self.lab = namespace, lab

    def checkpoint_step(self, side: str) -> HeldCheckpoint:
        """The plain fp32 step (``side="baseline"``), or the same seeded network wrapped by the
        student's ``checkpointed`` at their ``SEGMENTS`` (``"candidate"``)."""
        lab, batch = self.lab, self.lab.profile.batch_size
        images, labels = one_batch(lab, batch_size=2 * batch, augment=False)
        if side == "baseline":
            step = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
        else:
            wrap, segments = student(self.namespace, "checkpointed", "04"), segments_of(self.namespace)
            model = train.build_model(seed=lab.seed)
            step = train.TrainStep(model, train.StepConfig(), lab.device, net=wrap(model, segments))
        return HeldCheckpoint(step, images, labels, batch, lab)

    def accumulate(self, *, k: int, lr: float, size: int) -> HeldAccumulation:
        images, labels = one_batch(self.lab, batch_size=2 * self.lab.profile.batch_size, image_size=size,
                                   augment=False)
        return HeldAccumulation(student(self.namespace, "accumulate_step", "04"), self.lab, images, labels, k, lr)

    def training_bytes(self, cases) -> list[dict[str, float]]:
        """The student's ``training_bytes(parameters, optimizer, bytes_per_number)`` on each case, as
        plain numbers per part (:data:`TRAINING_PARTS`)."""
        fn = watched(student(self.namespace, "training_bytes", "04"), "training_bytes", "04")
        answers = []
        for parameters, optimizer, size in cases:
            try:  # as 04's cell declares it, whatever the student named its arguments
                got = fn(int(parameters), str(optimizer), int(size))
            except TypeError:  # or with bytes_per_number keyword-only
                got = fn(int(parameters), str(optimizer), bytes_per_number=int(size))
            if not isinstance(got, dict):
                raise StudentCodeError(f"training_bytes returned a {type(got).__name__}, not a dict of "
                                       f"{', '.join(TRAINING_PARTS)}")
            answers.append({part: float(got[part]) if part in got else float("nan") for part in TRAINING_PARTS})
        return answers

    def focus(self, side: str | None) -> None:
        pass

    def resident_peak(self, side: str, fn, device) -> tuple[object, None]:
        """``fn()``: in one process there is no outside from which to read a side's memory."""
        return fn(), None

    def checking(self):
        return contextlib.nullcontext()


def step_peak(step, lab, lr: float) -> tuple[int, int]:
    """Peak bytes of ``step(net, optimizer)`` on a fresh GroupNorm ResNet-18 and SGD, after a warm-up
    call (the gradients exist from then on): ``(tensors counted, c10's CPU allocator's peak, -1
    off the CPU)``. The allocator sees what the count can be kept from seeing (see ALLOCATOR_SLACK)."""
    net = train.group_norm_resnet(lab.seed).to(lab.device)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    step(net, opt)
    report = memory.peak_step_bytes(lambda: step(net, opt), lab.device, cpu_allocator=lab.device.type == "cpu")
    return report.peak_bytes, -1 if report.allocator_peak_bytes is None or lab.device.type != "cpu" else \
        report.allocator_peak_bytes



class Side:
    """04 in a worker: the plain step (the baseline's), the student's checkpointed step and their
    accumulation (the student's), each held for the judge to ask :data:`HeldCheckpoint.ASKED` or
    :data:`HeldAccumulation.ASKED` of; the student's ``training_bytes`` on plain numbers."""

    ASKED = ("checkpoint_step", "accumulate", "training_bytes")

    def __init__(self, namespace: dict, lab, *, student: bool):
        self.here, self.student = Here(namespace, lab), student

    def checkpoint_step(self) -> HeldCheckpoint:
        return self.here.checkpoint_step("candidate" if self.student else "baseline")

    def accumulate(self, *, k: int, lr: float, size: int) -> HeldAccumulation:
        if not self.student:
            raise PermissionError("the baseline's worker holds no student code (accumulate_step)")
        return self.here.accumulate(k=int(k), lr=float(lr), size=int(size))

    def training_bytes(self, *, cases: list) -> list[dict[str, float]]:
        if not self.student:
            raise PermissionError("the baseline's worker holds no student code (training_bytes)")
        return self.here.training_bytes([(int(n), str(o), int(b)) for n, o, b in cases])


# --- 04's rung: their checkpointing around their 03 step, spent on a doubled batch -----------------

def their_checkpointing(code, lab, made: Recipe) -> Recipe:
    """04's change: the student's checkpointing (``checkpointed``, ``SEGMENTS`` in ``code("04")``)
    around the network, at ``lab``'s batch (the rung's: twice the profile's)."""
    wrap, segments = student(code("04"), "checkpointed", "04"), code("04").get("SEGMENTS")
    return dataclasses.replace(made.configured(checkpoint_segments=int(segments or 0), batch_size=lab.profile.batch_size),
                               wrap=lambda model: wrap(model, segments))


RUNG = Rung(their_checkpointing,
            extras=lambda found, lab: {"batch_size": lab.profile.batch_size,
                                       "peak_ratio": measured(found, "04-peak-ratio")},
            in_worker=True, batch_factor=2, counts_peak=True, in_pipeline=False)
