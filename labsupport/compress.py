"""The harness of notebook 07: a trained fp32 model, its data, and what a compressed model is measured by.

Notebook 07 compresses a trained ResNet-18 for inference on the CPU, two ways, and measures each
against the fp32 model it came from: size, latency percentiles and accuracy.

- **Pruning** (the student's ``prune_globally`` and ``make_permanent``): half of the weights set to
  zero by magnitude with ``torch.nn.utils.prune``, a brief fine-tune with the masks in place
  (:func:`fine_tune`), then the masks folded into the weights.
- **int8 quantisation** (the student's ``quantize_int8``): the PT2E static flow of torchao
  (export, ``prepare_pt2e`` with the x86 Inductor quantiser, calibration, ``convert_pt2e``).
  A converted model holds int8 weights and quantise/dequantise steps around fp32 operators;
  ``torch.compile`` with Inductor's freezing lowers those patterns to oneDNN's int8 kernels. 07
  compiles fp32 and int8 alike, the lab's way (:func:`compiled`), so a speedup is the int8
  kernels', not the compiler's.

Everything here is the measurement and the plumbing around the student's functions; none of
their answers is implemented here. The models train at 32 px (the size 03's accuracy runs use,
so a model converges within the notebook's time budget) and are served in batches of 32.
Inference runs on the CPU whatever device trained the model: int8 through oneDNN is a CPU
deployment path.

What a model is measured by (sparsity, bytes, latency, accuracy) lives in :mod:`labsupport.inference`,
reachable here as ``ls.compress.X``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock

from . import hardware, pipeline, train
from .inference import (CPU, SERVE_BATCH, ComputedWith, Sparsity, accuracy, computed_with, int8_elements, latency,
                        model_bytes, prunable, quiet, sparsity, zipped_bytes)

__all__ = ["AMOUNT", "CALIBRATION_BATCHES", "CPU", "DISTILL_ALPHA", "DISTILL_LR", "DISTILL_SEEDS", "DISTILL_STEPS",
           "DISTILL_TEMPERATURE", "FINE_TUNE_LR", "FINE_TUNE_STEPS", "IMAGE_SIZE", "SERVE_BATCH", "TRAIN_STEPS",
           "ComputedWith", "Data", "Sparsity", "accuracy", "compiled", "computed_with", "deployable", "fine_tune",
           "int8_elements", "latency", "load_data", "model_bytes", "model_from", "prunable", "quiet", "serving",
           "small_network", "sparsity", "steps_for", "train_fp32", "train_small", "zipped_bytes"]


IMAGE_SIZE = train.PARITY_IMAGE_SIZE  # px: the models of 07 train and serve at this size
TRAIN_STEPS = train.PARITY_STEPS  # the fp32 model's training run (03's accuracy run)
FINE_TUNE_STEPS = 40  # the pruned model's fine-tune, with its masks in place
FINE_TUNE_LR = 0.01  # its peak learning rate (one-cycle); the fp32 run peaks at 0.05
CALIBRATION_BATCHES = 8  # training batches of SERVE_BATCH the quantiser observes
AMOUNT = 0.5  # the share of the weights pruned (the course's lab variant prunes 50%)
# Knowledge distillation: a small network trained from the fp32 ResNet-18 (the teacher) with
# alpha * task + (1 - alpha) * T^2 * KL(teacher || student) at temperature T, against the same
# network trained alone, the same steps on the same batches. Measured on class cpu (3 seeds, 160
# steps at 32 px): trained alone 83.6-85.8%, distilled with alpha 0.5 and T 4 84.5-88.9%, ahead by
# 0.9-3.5 points in each seed.
DISTILL_ALPHA = 0.5
DISTILL_TEMPERATURE = 4.0
DISTILL_STEPS = 160
DISTILL_LR = 0.05  # peak of the one-cycle schedule (SGD, momentum 0.9, weight decay 5e-4)
DISTILL_SEEDS = (0, 1)  # each trained pair, its own seeded weights and batches: the gap is their mean


@dataclasses.dataclass(frozen=True)
class Data:
    """The lab's images at :data:`IMAGE_SIZE`, decoded once and normalised."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    val_images: torch.Tensor
    val_labels: torch.Tensor

    def calibration(self, batches: int = CALIBRATION_BATCHES, seed: int = 0) -> list[torch.Tensor]:
        """``batches`` random training batches of :data:`SERVE_BATCH` images each, for the quantiser
        to observe (drawn with replacement: a test dataset has fewer images than that)."""
        g = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, len(self.train_labels), (batches * SERVE_BATCH,), generator=g)
        return list(self.train_images[idx].split(SERVE_BATCH))

    def serving_batch(self) -> torch.Tensor:
        """The first :data:`SERVE_BATCH` validation images (repeated where there are fewer): one request."""
        return self.val_images[torch.arange(SERVE_BATCH) % len(self.val_images)].contiguous()


def load_data(progress: bool = True) -> Data:
    """Both splits at :data:`IMAGE_SIZE`, as ``normalize``-d float32 tensors on the CPU."""
    (xt, yt), (xv, yv) = (pipeline.decode_once(split, size=IMAGE_SIZE, progress=progress)
                          for split in ("train", "val"))
    return Data(pipeline.normalize(xt), yt, pipeline.normalize(xv), yv)


def steps_for(profile: hardware.Profile, steps: int) -> int:
    """``steps``, or 2 on a profile that grades no speed (tests): the code runs, nothing converges."""
    return steps if profile.grades_speed else 2


def train_fp32(lab: hardware.Lab, data: Data, *, progress: bool = True) -> nn.Module:
    """A seeded ResNet-18 trained in float32 (03's accuracy run), returned on the CPU in eval mode."""
    step = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    train.parity_run(step, data.train_images, data.train_labels, data.val_images, data.val_labels,
                     steps=steps_for(lab.profile, TRAIN_STEPS), batch_size=train.PARITY_BATCH_SIZE,
                     seed=lab.seed, progress=progress, validate=False)
    return step.model.to(CPU).eval()


def fine_tune(model: nn.Module, lab: hardware.Lab, data: Data, *, progress: bool = True) -> nn.Module:
    """Train ``model`` briefly (:data:`FINE_TUNE_STEPS`, SGD with momentum, one-cycle to
    :data:`FINE_TUNE_LR`) on ``lab.device``; returned on the CPU in eval mode.

    A pruned model keeps its zeros here only while its masks are in place: the optimizer updates
    ``weight_orig`` and the mask multiplies it back to zero at every forward. Fold the masks in
    (``prune.remove``) before this, and the zeroed weights get gradients and grow back.
    """
    step = train.TrainStep(model, train.StepConfig(), lab.device)
    train.parity_run(step, data.train_images, data.train_labels, data.val_images, data.val_labels,
                     steps=steps_for(lab.profile, FINE_TUNE_STEPS), batch_size=train.PARITY_BATCH_SIZE,
                     seed=lab.seed + 1, progress=progress, max_lr=FINE_TUNE_LR, validate=False)
    return step.model.to(CPU).eval()


def small_network(seed: int = 0, width: int = 16) -> nn.Module:
    """The small network 07 distils into: three 3 x 3 convolutions (16, 32, 64 channels) with
    BatchNorm and ReLU, pooling, and a linear classifier; 24 k parameters against ResNet-18's 11.2 M."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        w = width
        return nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * w, 4 * w, 3, padding=1), nn.BatchNorm2d(4 * w), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(4 * w, 10))


def train_small(lab: hardware.Lab, data: Data, *, seed: int, teacher: nn.Module | None = None,
                loss=None, progress: bool = False) -> nn.Module:
    """:func:`small_network` trained on the CPU for :data:`DISTILL_STEPS` (2 on a profile that
    grades no speed), with batches and flips drawn from ``seed``: alone (cross-entropy) when
    ``teacher`` is None, else with ``loss(student_logits, teacher_logits, labels, alpha,
    temperature)`` at :data:`DISTILL_ALPHA` and :data:`DISTILL_TEMPERATURE`, the teacher's logits
    computed on the same batch. Returned in eval mode."""
    import torch.nn.functional as F

    model = small_network(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=DISTILL_LR, momentum=0.9, weight_decay=5e-4)
    steps = steps_for(lab.profile, DISTILL_STEPS)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=DISTILL_LR, total_steps=steps, pct_start=0.25)
    g = torch.Generator().manual_seed(seed)
    loop = range(steps)
    if progress:
        from tqdm.auto import tqdm
        loop = tqdm(loop, desc="distilling" if teacher is not None else "training alone", leave=False)
    model.train()
    for _ in loop:
        idx = torch.randint(0, len(data.train_labels), (train.PARITY_BATCH_SIZE,), generator=g)
        x, y = data.train_images[idx], data.train_labels[idx]
        x = torch.where((torch.rand(len(idx), generator=g) < 0.5).view(-1, 1, 1, 1), x.flip(3), x)
        if teacher is None:
            value = F.cross_entropy(model(x), y)
        else:
            with torch.no_grad():
                taught = teacher(x)
            value = loss(model(x), taught, y, DISTILL_ALPHA, DISTILL_TEMPERATURE)
        model.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        schedule.step()
    return model.eval()


class _UntiedBlock(BasicBlock):
    """torchvision's BasicBlock with a second ReLU module for its last activation.

    torchvision's block calls one ``self.relu`` twice. The x86 quantiser finds its fusion
    patterns (conv, add, ReLU) by module, and one ReLU module with two outputs stops it:
    ``ValueError: Input partition has more than one output node`` (torchao 0.18). Two ReLU
    modules compute the same thing, with the same state dict.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu_out(out + identity)


def deployable(model: nn.Module) -> nn.Module:
    """A copy of ``model`` on the CPU in eval mode, ready for the quantiser (see :class:`_UntiedBlock`)."""
    out = copy.deepcopy(model).to(CPU).eval()
    for block in out.modules():
        if type(block) is BasicBlock:
            block.__class__ = _UntiedBlock
            block.relu_out = nn.ReLU(inplace=True)
    return out


@contextlib.contextmanager
def serving() -> Iterator[None]:
    """Where 07 compiles a model to serve it on the CPU (:func:`compiled`): :func:`quiet`,
    ``torch.no_grad()``, Inductor's freezing on, and torchao's int8 passes registered.

    The int8 kernels need freezing (without it the lowering fails: ``onednn.qconv_prepack``), and
    the fp32 model is compiled the same way, so the comparison is fair.

    They need torchao's Inductor passes too, and those are registered only as a side effect of
    importing ``x86_inductor_quantizer``. A process that compiles an int8 model it did not quantise
    (the grader's judge: the student's worker quantises) lowers each int8 convolution to
    dequantise-then-fp32 instead, slower than fp32: at the real profile on class cpu-bf16 the
    reference's int8 speedup read 0.55x in the judge and 2.8x in the notebook. Importing it here
    gives every process that compiles the same kernels.
    """
    import torch._inductor.config as inductor

    # Below the int8 floor (a Colab torch, say) only fp32 is served: 07 stops at its int8 cell, and
    # torchao 0.18 is not made for that torch, so it is not imported for fp32's sake.
    if hardware.torch_problem("int8") is None:
        with quiet():
            import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer  # noqa: F401  (registers them)
    with quiet(), torch.no_grad(), inductor.patch(freezing=True):
        yield


def compiled(model: nn.Module):
    """``model`` compiled the lab's way for serving on the CPU: ``torch.compile`` in its default
    mode, inside :func:`serving` (freezing on). 07 compiles fp32 and int8 this way, whatever the
    student's 05 ``compile_inference`` does (on a GPU, a plain ``torch.compile`` without freezing,
    which the int8 kernels cannot lower). On class cpu at 32 px, max-autotune gave the same int8
    speedup (1.9x) and took 29 s rather than 9 to compile fp32."""
    return torch.compile(model)


def model_from(weights: dict[str, torch.Tensor]) -> nn.Module:
    """The lab's ResNet-18 holding ``weights`` (a state dict of :func:`train_fp32`'s model), on the
    CPU in eval mode: how 07's checks hand a trained model to the student's functions."""
    model = train.build_model()
    model.load_state_dict(weights)
    return model.to(CPU).eval()
