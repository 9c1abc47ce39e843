"""ResNet-18 and one training step with every knob the lab teaches, so notebooks compare variants
without copying a training loop.

:class:`StepConfig` holds the knobs (autocast dtype, GradScaler, channels_last, checkpointed
segments, accumulation, torch.compile); :class:`TrainStep` runs one optimizer update with them.
Device, dtype and compile are decided here, in one place, as in nanoGPT's ``train.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.checkpoint import checkpoint

from .measure import PhaseClock

PHASES = ("data wait", "host to device", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class StepConfig:
    """The knobs of one training step (Used by: notebooks 01-06; stored with every result)."""

    amp_dtype: str | None = None  # autocast dtype: "bfloat16", "float16", or None for fp32
    grad_scaler: bool = False  # scale the loss with torch.amp.GradScaler (needed for float16)
    channels_last: bool = False  # NHWC memory format for weights and inputs (faster convs with AMP)
    checkpoint_segments: int = 0  # 0: off; k: recompute the network body in k segments
    accumulation_steps: int = 1  # micro-batches per optimizer step (same update, less memory)
    compiled: bool = False  # torch.compile the model (not named `compile`: that is a builtin)
    compile_mode: str = "default"  # torch.compile mode: "default", "reduce-overhead", ...
    lr: float = 0.02  # SGD learning rate (0.05 spiked early: 65% vs 75% val acc after 120 steps)
    momentum: float = 0.9  # SGD momentum

    def __post_init__(self):
        if self.amp_dtype not in (None, "bfloat16", "float16"):
            raise ValueError(f"amp_dtype={self.amp_dtype!r}: use 'bfloat16', 'float16' or None.")
        if self.accumulation_steps < 1 or self.checkpoint_segments < 0:
            raise ValueError("accumulation_steps must be >= 1 and checkpoint_segments >= 0.")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def seed_everything(seed: int = 0) -> None:
    """Seed Python-side and torch RNGs; an explicit call, never done on import (Used by: 01-06)."""
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(num_classes: int = 10, seed: int = 0) -> nn.Module:
    """A freshly initialised torchvision ResNet-18 (no downloaded weights) (Used by: 01-06)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torchvision.models.resnet18(weights=None, num_classes=num_classes)


@contextlib.contextmanager
def batchnorm_stats_frozen(modules: list[nn.Module]):
    """Keep BatchNorm running statistics unchanged while a checkpointed segment is recomputed.

    The recomputation in backward runs the segment's forward a second time in training mode, which
    would update each BatchNorm's running mean and variance twice per step. Momentum 0 makes the
    update a no-op; the batch statistics used for the output, and so the gradients, are unchanged.
    """
    norms = [m for seg in modules for m in seg.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m.momentum, m.num_batches_tracked.clone() if m.num_batches_tracked is not None else None)
             for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, (momentum, tracked) in zip(norms, saved):
            m.momentum = momentum
            if tracked is not None:
                m.num_batches_tracked.copy_(tracked)


class CheckpointedResNet(nn.Module):
    """ResNet-18 whose body (stem and residual blocks) is recomputed in backward (Used by: 04).

    The body's 9 units (stem + 8 basic blocks) are split into ``segments`` contiguous segments;
    only each segment's input is kept for backward, and activations inside a segment are
    recomputed. Uses ``checkpoint(..., use_reentrant=False)``, the implementation PyTorch
    recommends (it supports keyword arguments, ``torch.compile`` and non-tensor outputs).
    """

    def __init__(self, resnet: torchvision.models.ResNet, segments: int):
        super().__init__()
        self.resnet = resnet  # kept whole so its state_dict matches a plain ResNet-18 (prefix aside)
        units = [nn.Sequential(resnet.conv1, resnet.bn1, resnet.relu, resnet.maxpool)]
        for layer in (resnet.layer1, resnet.layer2, resnet.layer3, resnet.layer4):
            units.extend(layer)
        if not 1 <= segments <= len(units):
            raise ValueError(f"checkpoint_segments={segments}: choose 1 to {len(units)}.")
        bounds = np.linspace(0, len(units), segments + 1).round().astype(int)
        self.segments = [nn.Sequential(*units[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for segment in self.segments:
            x = checkpoint(segment, x, use_reentrant=False,
                           context_fn=lambda s=segment: (contextlib.nullcontext(),
                                                         batchnorm_stats_frozen([s])))
        x = torch.flatten(self.resnet.avgpool(x), 1)
        return self.resnet.fc(x)


class TrainStep:
    """One optimizer update of a model under a :class:`StepConfig` (Used by: notebooks 01-06).

    ``step(images, labels)`` returns the batch's mean loss as a detached tensor on the device; it
    does not call ``.item()``, so it never forces a device sync the caller did not ask for.
    """

    def __init__(self, model: nn.Module, config: StepConfig = StepConfig(),
                 device: torch.device | str = "cpu", net: nn.Module | None = None):
        self.config = config
        self.device = torch.device(device)
        self.model = model.to(self.device)
        if config.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr,
                                         momentum=config.momentum)
        # ``net`` is what forward calls: the model itself, or a module wrapping it (a student's
        # checkpointed version, in notebook 04's checks); the optimizer updates ``model``.
        net = self.model if net is None else net
        if config.checkpoint_segments:
            net = CheckpointedResNet(net, config.checkpoint_segments)
        if config.compiled:
            net = torch.compile(net, mode=config.compile_mode)
        self.net = net  # what forward calls; self.model keeps the plain parameters
        self.autocast = (torch.autocast(self.device.type, dtype=getattr(torch, config.amp_dtype))
                         if config.amp_dtype else contextlib.nullcontext())
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.grad_scaler)

    def to_device(self, images: torch.Tensor, labels: torch.Tensor, non_blocking: bool = False):
        """Copy a batch to the step's device, in the step's memory format."""
        images = images.to(self.device, non_blocking=non_blocking)
        if self.config.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels.to(self.device, non_blocking=non_blocking)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor,
                 clock: PhaseClock | None = None) -> torch.Tensor:
        mark = clock.mark if clock else (lambda phase: None)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        mark("optimizer")
        n = images.shape[0]
        total = torch.zeros((), device=self.device)
        chunks = zip(images.tensor_split(self.config.accumulation_steps),
                     labels.tensor_split(self.config.accumulation_steps))
        for x, y in chunks:
            with self.autocast:
                # Weight each micro-batch by its share of the batch: the summed gradients then
                # equal the gradient of the full batch's mean loss, even for uneven splits.
                loss = F.cross_entropy(self.net(x), y) * (x.shape[0] / n)
            mark("forward")
            self.scaler.scale(loss).backward()
            mark("backward")
            total += loss.detach().float()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        mark("optimizer")
        return total


def make_step(config: StepConfig = StepConfig(), device: torch.device | str = "cpu",
              seed: int = 0, num_classes: int = 10) -> TrainStep:
    """A fresh seeded ResNet-18 with its training step (Used by: notebooks 01-06)."""
    return TrainStep(build_model(num_classes, seed), config, device)


def pipeline_step(batches: Iterator, step: TrainStep, *, non_blocking: bool = False,
                  item_every_step: bool = True) -> Callable[[], float | torch.Tensor]:
    """A zero-argument end-to-end step: wait for a batch, copy it, train (Used by: 01, 02, 06).

    ``item_every_step=True`` is the naive habit of logging ``loss.item()`` every step, which
    makes the host wait for the device at every step.
    """
    def run():
        images, labels = next(batches)
        loss = step(*step.to_device(images, labels, non_blocking))
        return loss.item() if item_every_step else loss
    return run


def phase_breakdown(batches: Iterator, step: TrainStep, *, steps: int, warmup: int = 1,
                    non_blocking: bool = False) -> dict[str, list[float]]:
    """Milliseconds per phase for each of ``steps`` steps (Used by: 01, 02; see PhaseClock).

    Returns ``{phase: [ms per step]}`` for the phases in :data:`PHASES`.
    """
    clock = PhaseClock(step.device)
    per_step: dict[str, list[float]] = {p: [] for p in PHASES}
    for i in range(warmup + steps):
        clock.totals_s.clear()
        clock.start()
        images, labels = next(batches)
        clock.mark("data wait")
        images, labels = step.to_device(images, labels, non_blocking)
        clock.mark("host to device")
        step(images, labels, clock=clock).item()
        if i >= warmup:
            for p in PHASES:
                per_step[p].append(clock.totals_s.get(p, 0.0) * 1000)
    return per_step


@torch.no_grad()
def evaluate(step: TrainStep, loader) -> float:
    """Top-1 accuracy of the step's model on a loader, under the step's autocast (Used by: 03-06)."""
    step.model.eval()
    correct = total = 0
    for images, labels in loader:
        images, labels = step.to_device(images, labels)
        with step.autocast:
            correct += (step.model(images).argmax(1) == labels).sum().item()
        total += labels.numel()
    step.model.train()
    return correct / max(total, 1)
