"""Graded checks of 03_amp: the student's ``choose_precision`` and ``amp_train_step``, measured now.

- ``03-amp-speedup`` and ``03-activation-ratio``: a mixed-precision step whose first loss matches
  fp32's and which keeps training is faster than fp32 and saves fewer activation bytes. Every
  timed call is one step from the same weights, checked against fp32's step from there
  (:class:`partners.FromOneStart`), so a step that does less when it is timed loses the speed.
  Where the lab trains in 16 bits, the speed counts only if the step's saved activations show 16
  bits (channels_last alone speeds a float32 step on some CPUs).
- ``03-accuracy-gap``: after the same short training run its accuracy is within reach of fp32's.
- ``03-fp16-scaler``: in float16 an overflowing update is skipped by the GradScaler.

Each check is written once, against ``sides``: :class:`Here` holds both steps in this process
(the notebook's self-check); the grader's judge passes its :class:`Remote`, which holds
the student's step in a worker of its own and fp32's in another, and gets back only numbers and
tensors (:class:`HeldStep`'s answers), so that it decides without running the student's code.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

import torch

from .. import measure, pipeline, train
from . import (StudentCodeError, judge, lab_bar, partners, register, speed, student,
               with_baseline)
from .g03_worker import HeldStep, Here, amp_step, precision  # noqa: F401 (re-exported)
from .judge_setup import Judged, MODEL_BYTES, RemoteSides
from .rungs import Recipe, Rung, measured


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


def timed_calls(held, draws: list[int]) -> tuple[Callable[[], object], list[partners.Call]]:
    """A call for the clock (a step from the marked weights, then its update at positions drawn only
    now) and the list of what each call did. Call *i* of either side reads ``draws[i]``."""
    calls: list[partners.Call] = []

    def call():
        loss = held.run()
        if len(draws) <= len(calls):
            draws.append(random.SystemRandom().getrandbits(62))
        calls.append(partners.Call(held.update_at(seed=draws[len(calls)]), torch.as_tensor(loss), 0))
        return loss
    return call, calls


def trains(held, steps: int) -> tuple[bool, str]:
    """:func:`partners.step_trains` on a held step: ``steps`` calls, then every weight moved, all finite."""
    before = held.weights()
    for i in range(steps):
        loss = held.call()
        if not math.isfinite(loss):
            return False, f"step {i} returned a non-finite loss ({loss})"
    return partners.weights_trained(before, held.weights(), held.names(), steps)


# A step that saves more than this share of fp32's activation bytes computes in float32: 16-bit
# autocast halves what the convolutions save (a float32 step saves as much as fp32's, 1.0).
MIXED_SEEN = 0.9


@register("03-amp-speedup", "03-activation-ratio")
def amp_speed_and_memory(namespace, lab, sides=None):
    """A mixed-precision step that trains is faster than fp32 and saves fewer activation bytes."""
    student(namespace, "amp_train_step", "03")
    sides = sides or Here(namespace, lab)
    fp32, amp = sides.held_step("baseline"), sides.held_step("candidate")
    # Partner 1: the first step's loss matches fp32's (same weights, same batch).
    ref_loss, amp_loss = fp32.call(), amp.call()
    correct, why = True, ""
    if not math.isfinite(amp_loss) or abs(amp_loss - ref_loss) > 0.02 * abs(ref_loss) + 0.02:
        correct, why = False, f"first-step loss {amp_loss:.4f}, fp32 gives {ref_loss:.4f}"
    # Partner 2: the step keeps training, with finite weights.
    if correct:
        correct, why = trains(amp, steps=2)
    # Partner 3, on what is timed: every timed call of either side is one step from the same
    # seeded weights, and each of your calls must train as fp32's does from there, read at
    # positions drawn after the call returned, on the clock.
    timed_fp32, timed_amp = sides.held_step("baseline"), sides.held_step("candidate")
    for held in (timed_fp32, timed_amp):
        held.mark()
    timed_amp.settle()
    draws: list[int] = []
    (time_fp32, fp32_calls), (time_amp, amp_calls) = timed_calls(timed_fp32, draws), timed_calls(timed_amp, draws)
    with sides.checking():
        cmp = measure.compare(time_fp32, time_amp, lab.device, rounds=lab.profile.rounds,
                              steps_per_round=lab.profile.steps_per_round, focus=sides.focus,
                              verify=getattr(sides, "verify", None))
    sides.focus(None)
    timed_ok, timed_why = (partners.updates_alike(amp_calls, [c.update for c in fp32_calls], amp.names())
                           if correct else (correct, why))
    ref_bytes, amp_bytes = fp32.saved_bytes(), amp.saved_bytes()
    saved = f"{amp_bytes / 2**20:.0f} MiB saved for backward vs {ref_bytes / 2**20:.0f} MiB in fp32"
    # The speed is mixed precision's only where the step computes in 16 bits. Where the lab trains
    # in 16 bits (the saving has a bar here), the step's saved activations must show it: on an
    # AVX-512 BF16 CPU, channels_last alone made a float32 step 1.3x faster than fp32's, at the bar.
    sixteen_bits = lab_bar("03-activation-ratio", lab).applies
    mixed = not sixteen_bits or amp_bytes <= MIXED_SEEN * ref_bytes
    fast = speed(lab, "03-amp-speedup", cmp.speedup.median, correct=timed_ok, why_incorrect=timed_why,
                 optimised=mixed, why_not_optimised=f"no 16-bit activations ({saved}): this speed is not mixed "
                                                    f"precision's (autocast to the dtype your choose_precision names)")
    fast = dataclasses.replace(fast, note=(fast.note + "; " if fast.note else "") + str(cmp) + baseline_precision(lab.device))
    fast = with_baseline(fast, baseline_step_ms=cmp.summary()["baseline_ms"])
    mem = judge("03-activation-ratio", amp_bytes / ref_bytes, lab, correct=correct, why_incorrect=why, note=saved)
    return [fast, mem]


def _evaluated_only(*args, **kwargs):
    raise RuntimeError("the judge's copy of a step only evaluates; it never trains")


@register("03-accuracy-gap")
def amp_accuracy(namespace, lab, sides=None):
    """After the same short training run, mixed precision's accuracy is within tolerance of fp32's."""
    student(namespace, "amp_train_step", "03")
    sides = sides or Here(namespace, lab)
    size = min(train.PARITY_IMAGE_SIZE, lab.profile.image_size)
    if not lab_bar("03-accuracy-gap", lab).applies:  # the test profile: too brief to compare, so no training
        held = sides.held_step("candidate", image_size=size)
        ok, why = trains(held, steps=2)  # runs; the step must train
        return [judge("03-accuracy-gap", None, lab, correct=ok, why_incorrect=why, note="your step trains every layer")]
    dtype, channels_last = sides.precision()
    steps = train.PARITY_STEPS
    # Each side trains where it runs; the weights come back here and are evaluated by the lab's own
    # model in the step's precision, on the validation split decoded here.
    (xv, yv) = pipeline.decode_once("val", size=size, progress=False)
    batches = list(zip(pipeline.normalize(xv).split(256), yv.split(256)))
    accuracies = []
    for side, config in (("baseline", train.StepConfig()),
                         ("candidate", train.StepConfig(amp_dtype=None if dtype is None else str(dtype).removeprefix("torch."),
                                                        channels_last=channels_last))):
        held = sides.held_step(side)
        sides.focus(side)
        held.parity(steps=steps, batch_size=train.PARITY_BATCH_SIZE, size=size, seed=lab.seed)
        state = held.state()
        sides.focus(None)
        judged = train.make_step(config, lab.device, seed=lab.seed, update=_evaluated_only if config.amp_dtype else None)
        judged.model.load_state_dict(dict(zip(judged.model.state_dict(), state)))
        accuracies.append(train.evaluate(judged, batches))
    fp32_acc, amp_acc = accuracies
    gap = 100 * (fp32_acc - amp_acc)
    note = f"fp32 {100 * fp32_acc:.1f}%, yours {100 * amp_acc:.1f}% after {steps} steps at {size} px"
    details = {"accuracy_fp32": fp32_acc, "accuracy": amp_acc, "steps": steps, "image_size": size}
    return [judge("03-accuracy-gap", gap, lab, note=note, details=details)]


@register("03-fp16-scaler")
def fp16_scaler(namespace, lab, sides=None):
    """In float16, amp_train_step uses the GradScaler: an overflowing step is skipped, not applied."""
    student(namespace, "amp_train_step", "03")
    sides = sides or Here(namespace, lab)
    # A modest initial scale, so that the normal steps after the overflow train at once instead
    # of first halving the scale down from 65536 (an untrained ResNet's gradients overflow there).
    held = sides.held_step("candidate", dtype="float16", init_scale=2.0 ** 8, batch_size=4, image_size=32)
    # 1e6 does not fit in float16 (max 65504): the forward overflows, the loss is not finite, and
    # a correct step lets the scaler skip optimizer.step(), leaving the weights untouched.
    before = held.weights()
    held.call(scale=1e6)
    after = held.weights()
    if not all(torch.isfinite(p).all() for p in after):
        ok, why = False, "an overflowing float16 step wrote inf/NaN into the weights: step through scaler.step(optimizer)"
    elif not all(torch.equal(p, b) for p, b in zip(after, before)):
        ok, why = False, "an overflowing float16 step changed the weights: the scaler should have skipped it"
    else:
        ok, why = trains(held, steps=5)
    return [judge("03-fp16-scaler", float(ok), lab, correct=ok, why_incorrect=why,
                          note="" if ok else why)]


from .g03_worker import RUNG  # noqa: E402,F401 (its rung is declared beside what its worker builds)


def asked_precision(sides) -> tuple[torch.dtype | None, bool]:
    """The student's 03 precision, from their carried ``choose_precision``, in their worker (03's
    and 05's judge sides): a StudentCodeError with its message where that raised or chose something else."""
    from .g03_worker import PRECISIONS
    from .workers import WorkerError

    try:
        reply = sides.ask("candidate", "precision")["value"]
        name, channels_last = reply.get("dtype"), reply.get("channels_last")
    except WorkerError as err:
        raise StudentCodeError(str(err)) from None
    except (AttributeError, KeyError, TypeError):
        raise StudentCodeError("choose_precision's choice did not come back") from None
    if name is not None and name not in PRECISIONS:
        raise StudentCodeError(f"choose_precision chose dtype {name!r}")
    return (getattr(torch, name) if name else None), bool(channels_last)


class Remote(RemoteSides):
    """03's judge side: each step held in its side's worker (:class:`~.g03_worker.Side`)."""

    def held_step(self, side: str, **config):
        """fp32's step (baseline) or the student's (candidate), held in ``side``'s worker (:class:`~.g03_worker.Here`'s arguments)."""
        return self.sides.held(side, "held_step", asked=HeldStep.ASKED, **config)

    def precision(self):
        return asked_precision(self.sides)


# How the judge sets up 03's checks: the lab's fp32 step in a worker of its own; a model's state crosses.
JUDGED = Judged(baseline=True, buffer_floor=MODEL_BYTES + 2**20, compared=("03-amp-speedup",), remote=Remote)
