"""ResNet-18 and the harness of one training step, so notebooks compare variants without
copying a training loop.

:class:`TrainStep` owns a seeded model, its SGD optimizer and a GradScaler, and runs one optimizer
update: the lab's fp32 baseline update, or the student's own (03's ``amp_train_step``) passed as
``update``, through the student's own network (04's ``checkpointed`` wrapper) passed as ``net``.
:class:`StepConfig` records what the step is (precision, memory format, checkpointing, compile)
and is stored with every result. The optimisations themselves are the students' answers, so
none of them is implemented here.
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

from .measure import PhaseClock
from .profiling import PHASES  # the step's phases, as PhaseClock stamps them and profiles are read by


@dataclass(frozen=True)
class StepConfig:
    """The knobs of one training step (stored with every result)."""

    amp_dtype: str | None = None  # 16-bit type the update autocasts to: "bfloat16", "float16", None
    channels_last: bool = False  # NHWC memory format for weights and inputs (faster convs with AMP)
    checkpoint_segments: int = 0  # 0: off; k: the network given as `net` recomputes k segments
    batch_size: int | None = None  # images per optimizer step, where it differs from the profile's
    compiled: bool = False  # torch.compile the network (not named `compile`: that is a builtin)
    compile_mode: str = "default"  # torch.compile mode: "default", "reduce-overhead", ...
    compile_backend: str = "inductor"  # torch.compile backend (the tiny profile's rungs: "aot_eager")
    lr: float = 0.02  # SGD learning rate (0.05 spiked early: 65% vs 75% val acc after 120 steps)
    momentum: float = 0.9  # SGD momentum

    def __post_init__(self):
        if isinstance(self.amp_dtype, torch.dtype):  # torch.bfloat16 -> "bfloat16": results store strings
            object.__setattr__(self, "amp_dtype", str(self.amp_dtype).removeprefix("torch."))
        if self.amp_dtype not in (None, "bfloat16", "float16"):
            raise ValueError(f"amp_dtype={self.amp_dtype!r}: use 'bfloat16', 'float16' or None.")
        if self.checkpoint_segments < 0:
            raise ValueError("checkpoint_segments must be >= 0.")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def seed_everything(seed: int = 0) -> None:
    """Seed Python-side and torch RNGs; an explicit call, never done on import."""
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(num_classes: int = 10, seed: int = 0) -> nn.Module:
    """A freshly initialised torchvision ResNet-18 (no downloaded weights)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torchvision.models.resnet18(weights=None, num_classes=num_classes)


Update = Callable[..., torch.Tensor]  # (net, optimizer, scaler, images, labels, dtype) -> loss


@contextlib.contextmanager
def _phase_hooks(step: "TrainStep", clock: PhaseClock | None):
    """Stamp the phases of a student's update with module and gradient hooks, without touching it.

    Time up to the network's forward is "optimizer" (zero_grad), the forward is "forward", up to
    the gradient of the first layer's weight (the last one backward computes) is "backward", and
    the rest is "optimizer" again (the scaler's step and update). With micro-batches each
    forward and backward is charged to its phase. No clock: no hooks.
    """
    if clock is None:
        yield
        return
    params = [p for p in step.model.parameters() if p.requires_grad]
    handles = [step.net.register_forward_pre_hook(lambda *_: clock.mark("optimizer")),
               step.net.register_forward_hook(lambda *_: clock.mark("forward"))]
    if params:  # the first parameter's gradient is accumulated last in backward
        handles.append(params[0].register_post_accumulate_grad_hook(lambda _: clock.mark("backward")))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class TrainStep:
    """One optimizer update of a model.

    ``step(images, labels)`` returns the batch's mean loss as a detached tensor on the device; it
    does not call ``.item()``, so it never forces a device sync the caller did not ask for.

    - ``net``: what the forward pass calls; the model itself, or a module wrapping it (04's
      checkpointed version). The optimizer updates ``model``'s parameters either way.
    - ``update``: a function ``update(net, optimizer, scaler, images, labels, dtype)`` that runs
      one update and returns the loss (03's ``amp_train_step``). Without it the step runs the
      lab's float32 baseline update. ``dtype`` is ``config.amp_dtype`` as a torch dtype (or None)
      and the scaler is enabled for float16 only.
    """

    def __init__(self, model: nn.Module, config: StepConfig = StepConfig(),
                 device: torch.device | str = "cpu", net: nn.Module | None = None,
                 update: Update | None = None):
        if config.amp_dtype and update is None:
            raise ValueError(f"StepConfig(amp_dtype={config.amp_dtype!r}) needs update=: the lab's own "
                             "step trains in float32; pass your mixed-precision step (03's amp_train_step).")
        self.config = config
        self.device = torch.device(device)
        self.model = model.to(self.device)
        if config.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr,
                                         momentum=config.momentum)
        net = self.model if net is None else net
        if config.compiled:  # a mode is Inductor's: another backend takes none
            net = (torch.compile(net, mode=config.compile_mode) if config.compile_backend == "inductor"
                   else torch.compile(net, backend=config.compile_backend))
        self.net = net  # what forward calls; self.model keeps the plain parameters
        self.update = update
        self.dtype = getattr(torch, config.amp_dtype) if config.amp_dtype else None
        self.autocast = (torch.autocast(self.device.type, dtype=self.dtype) if self.dtype is not None
                         else contextlib.nullcontext())  # for evaluation (evaluate)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype is torch.float16)

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
        if self.update is not None:  # the student's update, its phases stamped by hooks
            with _phase_hooks(self, clock):
                loss = self.update(self.net, self.optimizer, self.scaler, images, labels, self.dtype)
            mark("optimizer")
            return torch.as_tensor(loss).detach()
        self.optimizer.zero_grad()  # frees the gradients (set_to_none is the default since torch 2.0)
        mark("optimizer")
        loss = F.cross_entropy(self.net(images), labels)
        mark("forward")
        loss.backward()
        mark("backward")
        self.optimizer.step()
        mark("optimizer")
        return loss.detach()


def make_step(config: StepConfig = StepConfig(), device: torch.device | str = "cpu",
              seed: int = 0, num_classes: int = 10, *, update: Update | None = None,
              wrap: Callable[[nn.Module], nn.Module] | None = None) -> TrainStep:
    """A fresh seeded ResNet-18 with its training step.

    ``update`` is the student's update function (see :class:`TrainStep`); ``wrap(model)`` builds
    the network forward calls around the model (04: ``lambda m: checkpointed(m, SEGMENTS)``).
    """
    model = build_model(num_classes, seed)
    return TrainStep(model, config, device, net=wrap(model) if wrap else None, update=update)


def pipeline_step(batches: Iterator, step: TrainStep, *, non_blocking: bool = False,
                  item_every_step: bool = True) -> Callable[[], float | torch.Tensor]:
    """A zero-argument end-to-end step: wait for a batch, copy it, train.

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
    """Milliseconds per phase for each of ``steps`` steps (see PhaseClock).

    Returns ``{phase: [ms per step]}`` for the phases in :data:`PHASES`, for the lab's update and
    a student's alike (hooks stamp a student's update: see :func:`_phase_hooks`).
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
    """Top-1 accuracy of the step's model on a loader, under the step's autocast."""
    step.model.eval()
    correct = total = 0
    for images, labels in loader:
        images, labels = step.to_device(images, labels)
        with step.autocast:
            correct += (step.model(images).argmax(1) == labels).sum().item()
        total += labels.numel()
    step.model.train()
    return correct / max(total, 1)


def grads_and_stats(net: nn.Module, model: nn.Module, images: torch.Tensor, labels: torch.Tensor):
    """One backward through ``net``: ``(gradients of model's parameters, BatchNorm running stats)``;
    a checkpointed network must give the plain one's.
    """
    model.zero_grad(set_to_none=True)
    F.cross_entropy(net(images), labels).backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    stats = [b.detach().clone() for name, b in model.named_buffers() if "running" in name]
    return grads, stats


def step_flops(image_size: int, batch_size: int = 1, num_classes: int = 10) -> int:
    """FLOPs of one training step of the lab's ResNet-18 on ``batch_size`` images of ``image_size``
    px: forward and backward, counted by ``torch.utils.flop_counter.FlopCounterMode`` on the
    step itself, run on the meta device (shapes only, nothing computed).

    What it counts: the matmuls and convolutions (2 FLOPs per multiply-add), forward and backward;
    the first convolution computes no gradient for the images. What it does not: elementwise
    operators (BatchNorm, ReLU, the optimizer's update), data movement, and the recomputation of a
    checkpointed step (the model's FLOPs, as utilisation figures count them). The same on every
    rung: AMP, channels_last and compile change how fast the FLOPs run, not how many there are.
    """
    from torch.utils.flop_counter import FlopCounterMode

    # Counted on 2 images at least, then scaled (every counted FLOP is per image): BatchNorm in
    # training mode refuses one image whose last feature map is 1 x 1 (32 px and below).
    counted = max(batch_size, 2)
    with torch.device("meta"):
        model = torchvision.models.resnet18(num_classes=num_classes)
        images = torch.empty(counted, 3, image_size, image_size)
        labels = torch.zeros(counted, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(images), labels).backward()
    return int(counter.get_total_flops()) * batch_size // counted


def group_norm_resnet(seed: int = 0) -> nn.Module:
    """ResNet-18 with GroupNorm in place of BatchNorm.

    BatchNorm normalises with the statistics of the batch it sees, so k micro-batches are not the
    same computation as one large batch; a per-sample norm makes accumulation exactly equal.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torchvision.models.resnet18(num_classes=10, norm_layer=lambda c: nn.GroupNorm(8, c))


# The accuracy-parity run of 03: long enough that both runs converge, since the gap between two
# short, unconverged runs is mostly noise, and at a reduced image size so it fits the time budget
# (mixed precision's rounding does not depend on the image size).
PARITY_IMAGE_SIZE = 32
PARITY_BATCH_SIZE = 64
PARITY_STEPS = 160
PARITY_MAX_LR = 0.05


def parity_run(step: TrainStep, train_images, train_labels, val_images, val_labels, *, steps: int,
               batch_size: int, seed: int = 0, progress: bool = False, max_lr: float = PARITY_MAX_LR,
               validate: bool = True) -> float | None:
    """Train ``step`` for ``steps`` steps (one-cycle LR to ``max_lr``, random flips) and return val
    accuracy (None without ``validate``).

    Data order and flips come from ``seed``, so two steps trained with the same seed see the same
    batches.
    """
    sched = torch.optim.lr_scheduler.OneCycleLR(step.optimizer, max_lr=max_lr,
                                                total_steps=steps, pct_start=0.25)
    g = torch.Generator().manual_seed(seed)
    loop = range(steps)
    if progress:
        from tqdm.auto import tqdm
        loop = tqdm(loop, desc="training", leave=False)
    for _ in loop:
        idx = torch.randint(0, len(train_labels), (batch_size,), generator=g)
        x = train_images[idx]
        x = torch.where((torch.rand(batch_size, generator=g) < 0.5).view(-1, 1, 1, 1), x.flip(3), x)
        step(*step.to_device(x, train_labels[idx]))
        sched.step()
    if not validate:
        return None
    batches = zip(val_images.split(256), val_labels.split(256))
    return evaluate(step, batches)


def inference_setup(device: torch.device, images: torch.Tensor, dtype: torch.dtype | None, seed: int = 0):
    """A seeded ResNet-18 for inference, the batch on the device, and its autocast.

    Returns ``(model, images, autocast)``: the model in eval mode and channels_last, and autocast
    to ``dtype`` (your 03 precision choice), or off for float32 when ``dtype`` is None.
    """
    model = build_model(seed=seed).to(device).eval().to(memory_format=torch.channels_last)
    images = images.to(device).contiguous(memory_format=torch.channels_last)
    autocast = (torch.autocast(device.type, dtype=dtype) if dtype is not None
                else contextlib.nullcontext())
    return model, images, autocast


@contextlib.contextmanager
def exact_fp32():
    """float32 matmuls and convolutions in full float32 on CUDA: TF32 off, then restored.

    On Ampere and newer GPUs cuDNN convolutions run in TF32 by default (10-bit mantissa), so two
    mathematically equal float32 computations, such as a checkpointed and a plain backward, can
    differ by more than a float32 tolerance. Comparisons of gradients run inside this. It uses
    torch's ``fp32_precision`` settings (torch 2.9+; the older boolean TF32 flags are deprecated
    and must not be mixed with them). A no-op for CPU work.
    """
    # cudnn.conv too: a child set explicitly stops inheriting cudnn's setting, and torch.export
    # sets it (torch 2.14: after an export, cudnn.conv.fp32_precision stays "tf32" whatever cudnn says).
    settings = [torch.backends.cuda.matmul, torch.backends.cudnn, torch.backends.cudnn.conv]
    saved = [owner.fp32_precision for owner in settings]
    try:
        for owner in settings:
            owner.fp32_precision = "ieee"
        yield
    finally:
        for owner, value in zip(settings, saved):
            owner.fp32_precision = value
