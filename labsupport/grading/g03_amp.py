"""Graded checks of 03_amp: the student's ``choose_precision`` and ``amp_train_step``, measured now.

- ``03-amp-speedup`` and ``03-activation-ratio``: a mixed-precision step whose first loss matches
  fp32's and which keeps training is faster than fp32 and saves fewer activation bytes. Every
  timed call is one step from the same weights, checked against fp32's step from there
  (:class:`partners.FromOneStart`), so a step that does less when it is timed loses the speed.
- ``03-accuracy-gap``: after the same short training run its accuracy is within reach of fp32's.
- ``03-fp16-scaler``: in float16 an overflowing update is skipped by the GradScaler.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from .. import measure, memory, pipeline, train
from . import CheckResult, StudentCodeError, judge, one_batch, partners, register, speed, student


def amp_step(fn: Callable, dtype: torch.dtype | None, channels_last: bool, device: torch.device,
             seed: int = 0, init_scale: float | None = None, compiled: bool = False) -> train.TrainStep:
    """The student's ``amp_train_step`` as the update of a fresh seeded ResNet-18 step (Used by: 03-06)."""
    name = str(dtype).removeprefix("torch.") if dtype is not None else None
    step = train.make_step(train.StepConfig(amp_dtype=name, channels_last=channels_last, compiled=compiled),
                           device, seed=seed, update=fn)
    if init_scale is not None:
        step.scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=dtype is torch.float16)
    return step


def precision(choose: Callable, machine) -> tuple[torch.dtype | None, bool]:
    """``(dtype, channels_last)`` from the student's ``choose_precision(machine)``, checked (Used by: 03-06)."""
    choice = choose(machine)
    try:
        dtype, channels_last = choice["dtype"], bool(choice["channels_last"])
    except (TypeError, KeyError):
        raise StudentCodeError("choose_precision must return {'dtype': ..., 'channels_last': ...}, "
                               f"not {choice!r}") from None
    if dtype not in (None, torch.float16, torch.bfloat16):
        raise StudentCodeError(f"choose_precision chose dtype {dtype!r}: use torch.float16, "
                               "torch.bfloat16 or None.")
    return dtype, channels_last


def baseline_precision(device: torch.device) -> str:
    """On CUDA, what the fp32 baseline of the speedup ran in, as a note: the lab compares with fp32 as
    PyTorch runs it by default, whose convolutions are TF32 on Ampere and newer (03's text says so);
    "" elsewhere, where float32 is float32."""
    if device.type != "cuda":
        return ""
    def effective(*owners) -> str:  # a setting of "none" inherits its parent's
        return next((o.fp32_precision for o in owners if o.fp32_precision != "none"), "ieee")

    b = torch.backends
    conv, matmul = effective(b.cudnn.conv, b.cudnn, b), effective(b.cuda.matmul, b)
    return (f"; the fp32 step ran as PyTorch runs it by default: convolutions in {conv}, matmuls in {matmul} "
            "(fp32_precision)")


@register("03-amp-speedup", "03-activation-ratio")
def amp_speed_and_memory(namespace, lab):
    """A mixed-precision step that trains is faster than fp32 and saves fewer activation bytes."""
    fn = student(namespace, "amp_train_step", "03")
    dtype, channels_last = precision(student(namespace, "choose_precision", "03"), lab.machine)
    images, labels = one_batch(lab)
    fp32 = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    amp = amp_step(fn, dtype, channels_last, lab.device, seed=lab.seed)
    ref_x, ref_y = fp32.to_device(images, labels)
    amp_x, amp_y = amp.to_device(images, labels)
    # Partner 1: the first step's loss matches fp32's (same weights, same batch).
    ref_loss, amp_loss = float(fp32(ref_x, ref_y)), float(amp(amp_x, amp_y))
    correct, why = True, ""
    if not math.isfinite(amp_loss) or abs(amp_loss - ref_loss) > 0.02 * abs(ref_loss) + 0.02:
        correct, why = False, f"first-step loss {amp_loss:.4f}, fp32 gives {ref_loss:.4f}"
    # Partner 2: the step keeps training, with finite weights.
    if correct:
        correct, why = partners.step_trains(amp, amp_x, amp_y, steps=2)
    # Partner 3, on what is timed: every timed call of either side is one step from fp32's weights
    # after its first step, and each of your calls must train as fp32's does from there.
    start = {name: value.detach().clone() for name, value in fp32.model.state_dict().items()}
    timed_fp32 = partners.FromOneStart(fp32, start, (ref_x, ref_y), seed=lab.seed)
    timed_amp = partners.FromOneStart(amp, start, (amp_x, amp_y), seed=lab.seed)
    timed_amp.settle()
    cmp = measure.compare(timed_fp32, timed_amp, lab.device,
                          rounds=lab.profile.rounds, steps_per_round=lab.profile.steps_per_round)
    timed_ok, timed_why = (partners.updates_alike(timed_amp.calls, [c.update for c in timed_fp32.calls],
                                                  timed_amp.names) if correct else (correct, why))
    fast = speed(lab, "03-amp-speedup", cmp.speedup.median, correct=timed_ok, why_incorrect=timed_why)
    fast = dataclasses.replace(fast, note=(fast.note + "; " if fast.note else "") + str(cmp) + baseline_precision(lab.device))
    ref_bytes = memory.saved_activation_bytes(lambda: fp32(ref_x, ref_y), fp32.model)
    amp_bytes = memory.saved_activation_bytes(lambda: amp(amp_x, amp_y), amp.model)
    mem = judge("03-activation-ratio", amp_bytes / ref_bytes, lab.machine.as_dict(),
                        correct=correct, why_incorrect=why,
                        note=f"{amp_bytes / 2**20:.0f} MiB saved for backward vs {ref_bytes / 2**20:.0f} MiB in fp32")
    return [fast, mem]


@register("03-accuracy-gap")
def amp_accuracy(namespace, lab):
    """After the same short training run, mixed precision's accuracy is within tolerance of fp32's."""
    fn = student(namespace, "amp_train_step", "03")
    dtype, channels_last = precision(student(namespace, "choose_precision", "03"), lab.machine)
    size = min(train.PARITY_IMAGE_SIZE, lab.profile.image_size)
    (xt, yt), (xv, yv) = ((pipeline.normalize(x), y) for x, y in
                          (pipeline.decode_once(s, size=size, progress=False) for s in ("train", "val")))
    if not lab.profile.grades_speed:  # the test profile: too brief to compare accuracy, so no training
        step = amp_step(fn, dtype, channels_last, lab.device, seed=lab.seed)  # runs; the step must train
        ok, why = partners.step_trains(step, *step.to_device(xt[:train.PARITY_BATCH_SIZE], yt[:train.PARITY_BATCH_SIZE]), steps=2)
        return [CheckResult("03-accuracy-gap", None, None, "lower", lab.machine.device_class,
                            "n/a" if ok else "fail",
                            f"profile {lab.profile.name} trains too briefly to compare accuracy; your step "
                            "trains every layer" if ok else f"correctness check failed: {why}", {},
                            "n/a" if ok else "incorrect")]
    steps = train.PARITY_STEPS
    kw = dict(steps=steps, batch_size=train.PARITY_BATCH_SIZE, seed=lab.seed)
    fp32_acc = train.parity_run(train.make_step(train.StepConfig(), lab.device, seed=lab.seed), xt, yt, xv, yv, **kw)
    amp_acc = train.parity_run(amp_step(fn, dtype, channels_last, lab.device, seed=lab.seed), xt, yt, xv, yv, **kw)
    gap = 100 * (fp32_acc - amp_acc)
    note = f"fp32 {100 * fp32_acc:.1f}%, yours {100 * amp_acc:.1f}% after {steps} steps at {size} px"
    details = {"accuracy_fp32": fp32_acc, "accuracy": amp_acc, "steps": steps, "image_size": size}
    return [judge("03-accuracy-gap", gap, lab.machine.as_dict(), note=note, details=details)]


@register("03-fp16-scaler")
def fp16_scaler(namespace, lab):
    """In float16, amp_train_step uses the GradScaler: an overflowing step is skipped, not applied."""
    fn = student(namespace, "amp_train_step", "03")
    # A modest initial scale, so that the normal steps after the overflow train at once instead
    # of first halving the scale down from 65536 (an untrained ResNet's gradients overflow there).
    step = amp_step(fn, torch.float16, False, lab.device, seed=lab.seed, init_scale=2.0 ** 8)
    images, labels = one_batch(lab, batch_size=4, image_size=32)
    images, labels = step.to_device(images, labels)
    # 1e6 does not fit in float16 (max 65504): the forward overflows, the loss is not finite, and
    # a correct step lets the scaler skip optimizer.step(), leaving the weights untouched.
    before = [p.detach().clone() for p in step.model.parameters()]
    step(images * 1e6, labels)
    params = list(step.model.parameters())
    if not all(torch.isfinite(p).all() for p in params):
        ok, why = False, "an overflowing float16 step wrote inf/NaN into the weights: step through scaler.step(optimizer)"
    elif not all(torch.equal(p, b) for p, b in zip(params, before)):
        ok, why = False, "an overflowing float16 step changed the weights: the scaler should have skipped it"
    else:
        ok, why = partners.step_trains(step, images, labels, steps=5)
    return [judge("03-fp16-scaler", float(ok), lab.machine.as_dict(), correct=ok, why_incorrect=why,
                          note="" if ok else why)]


