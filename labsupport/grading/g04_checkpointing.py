"""Graded checks of 04_checkpointing: the student's ``checkpointed``, ``SEGMENTS`` and ``accumulate_step``.

- ``04-grad-match``: the checkpointed network gives the plain one's gradients and BatchNorm statistics.
- ``04-activation-ratio``, ``04-peak-ratio``, ``04-fits-budget``, ``04-time-overhead``: it holds
  less in the forward, its step peaks lower, the doubled batch fits the budget, at a bounded cost.
  Every timed call of the overhead is one step from the same weights, checked against the plain
  step's from there and counted (its convolutions, recomputation included, as an untimed call's).
- ``04-accum-match``: the model sees k micro-batches, which give the large batch's gradients and one
  optimizer update, and (at the real scale) lower the step's peak memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import measure, memory, train
from . import StudentCodeError, judge, one_batch, partners, register, speed, student


def segments_of(namespace) -> int:
    """The student's ``SEGMENTS``, checked to be a whole number of ResNet-18's 9 body units."""
    segments = namespace.get("SEGMENTS")
    if not isinstance(segments, int) or not 1 <= segments <= 9:
        raise StudentCodeError(f"SEGMENTS = {segments!r}: set it to the number of checkpointed segments "
                               "you chose, from 1 to 9 (ResNet-18's body has 9 units).")
    return segments


@register("04-grad-match", "04-activation-ratio", "04-peak-ratio", "04-fits-budget", "04-time-overhead")
def checkpointing(namespace, lab):
    """Checkpointing keeps the gradients, halves what the forward holds, fits the larger batch, at a bounded cost."""
    wrap = student(namespace, "checkpointed", "04")
    segments = segments_of(namespace)
    machine, batch = lab.machine.as_dict(), lab.profile.batch_size
    images, labels = one_batch(lab, batch_size=2 * batch)
    images, labels = images.to(lab.device), labels.to(lab.device)
    small_x, small_y = images[:batch], labels[:batch]

    plain = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    model = train.build_model(seed=lab.seed)
    ckpt = train.TrainStep(model, train.StepConfig(), lab.device, net=wrap(model, segments))

    # The partner: same gradients and the same BatchNorm running statistics after one backward.
    with train.exact_fp32():  # no TF32: a float32 tolerance must mean float32 arithmetic
        want = train.grads_and_stats(plain.net, plain.model, small_x, small_y)
        got = train.grads_and_stats(ckpt.net, ckpt.model, small_x, small_y)
    why = (partners.first_mismatch("gradients", got[0], want[0], rtol=1e-4, atol=1e-5)
           or partners.first_mismatch("BatchNorm running statistics", got[1], want[1], rtol=1e-5, atol=1e-6))
    partner = dict(correct=not why, why_incorrect=why)
    grad = judge("04-grad-match", float(not why), machine, **partner,
                         note=f"{len(want[0])} gradients and {len(want[1])} BatchNorm statistics compared")

    held = {name: memory.forward_bytes(lambda s=s: F.cross_entropy(s.net(small_x), small_y), lab.device)
            for name, s in (("plain", plain), ("ckpt", ckpt))}
    act = judge("04-activation-ratio", held["ckpt"] / held["plain"], machine, **partner,
                        note=f"the forward holds {held['ckpt'] / 2**20:.0f} MiB vs {held['plain'] / 2**20:.0f} MiB")

    for s in (plain, ckpt):  # warm-up: optimizer state exists before peaks are measured
        s(small_x, small_y)
    reports = {name: memory.peak_step_bytes(lambda s=s, x=x, y=y: s(x, y), lab.device)
               for name, s, x, y in (("plain", plain, small_x, small_y), ("ckpt", ckpt, small_x, small_y),
                                     ("plain-2x", plain, images, labels), ("ckpt-2x", ckpt, images, labels))}
    # Graded on the count of tensor storages, the same on every device. On CUDA the caching
    # allocator's own peaks (workspaces and block rounding included) are reported beside it: not yet
    # graded, since no GPU run has measured the reference's budget on them.
    peak = {k: r.peak_bytes for k, r in reports.items()}
    allocator = {f"allocator_{k}": r.allocator_peak_bytes for k, r in reports.items()
                 if r.allocator_peak_bytes is not None}
    budget = memory.BUDGET_FACTOR * peak["plain"]
    mib = {k: v / 2**20 for k, v in peak.items()}
    beside = (f"; the CUDA allocator's peaks: checkpointed {allocator['allocator_ckpt-2x'] / 2**20:.0f} MiB, "
              f"plain {allocator['allocator_plain-2x'] / 2**20:.0f} MiB") if allocator else ""
    peak_check = speed(lab, "04-peak-ratio", peak["ckpt"] / peak["plain"], "lower", **partner,
                        note=f"peak {mib['ckpt']:.0f} MiB vs {mib['plain']:.0f} MiB at batch {batch}")
    fits = judge("04-fits-budget", peak["ckpt-2x"] / budget, machine, **partner,
                         note=(f"batch {2 * batch}: checkpointed {mib['ckpt-2x']:.0f} MiB, plain "
                               f"{mib['plain-2x']:.0f} MiB, budget {budget / 2**20:.0f} MiB (tensors counted)"
                               + beside),
                         details={"budget_bytes": budget, **{f"peak_{k}": v for k, v in peak.items()}, **allocator})

    # What is timed is checked: every timed call is one step from the plain step's weights now, and
    # each checkpointed call must train as the plain one does from there, running as many
    # convolutions (its recomputation included) as an untimed call of it.
    start = partners.snapshot(plain.model)
    timed_plain = partners.FromOneStart(plain, start, (small_x, small_y), seed=lab.seed, count_convolutions=True)
    timed_ckpt = partners.FromOneStart(ckpt, start, (small_x, small_y), seed=lab.seed, count_convolutions=True)
    timed_ckpt()
    untimed = timed_ckpt.calls.pop().convolutions
    # More rounds than a speedup check: the overhead is judged against a bar, not just reported.
    cmp = measure.compare(timed_plain, timed_ckpt, lab.device,
                          rounds=max(7, lab.profile.rounds), steps_per_round=lab.profile.steps_per_round)
    overhead = 1 / cmp.speedup.median - 1
    timed_ok, timed_why = (partners.updates_alike(timed_ckpt.calls, [c.update for c in timed_plain.calls],
                                                  timed_ckpt.names, baseline="the plain network's step",
                                                  convolutions=untimed) if not why else (False, why))
    cost = speed(lab, "04-time-overhead", overhead, "lower", correct=timed_ok, why_incorrect=timed_why,
                  note=f"{cmp.summary()['candidate_ms']:.0f} ms vs {cmp.summary()['baseline_ms']:.0f} ms "
                              f"per step ({cmp.speedup.n} paired rounds, speedup IQR {cmp.speedup.q1:.2f}-"
                              f"{cmp.speedup.q3:.2f})")
    return [grad, act, peak_check, fits, cost]


# With 4 micro-batches a step's peak must be at most this fraction of one batch's (the reference at
# 64 px, batch 64, class cpu: 79 MiB against 140 MiB, 0.56).
ACCUMULATION_PEAK_FALL = 0.85


# An honest accumulation differs from one large batch's gradients by float32 rounding, and on a GPU
# by the difference between cuDNN's algorithms for the two batch sizes (exact float32, TF32 off).
# That floor is measured on the device with the lab's own accumulation; a student's may differ from
# the large batch by FLOOR_MARGIN times as much (another summation order). Without it, the reference
# failed on an H200 (2026-11-26: one of conv1's gradients 17x its value apart, tolerance 1e-6).
# Averaging uneven micro-batches by k instead of by their sizes weights each micro-batch's gradient
# wrongly by 1/3 - 342/1024 = 0.07% of it at the GPU profile (6% at the tiny one): still caught
# where the floor is float32 rounding, as on a CPU.
FLOOR_MARGIN = 4.0


def accumulation_floor(want: list[torch.Tensor], images: torch.Tensor, labels: torch.Tensor, k: int,
                       lab) -> list[float]:
    """Per gradient, the largest difference between ``want`` (one large batch) and the lab's own
    accumulation of ``k`` micro-batches (each loss weighted by its share of the batch) on the same
    device: how close an honest accumulation can get here. Run inside ``train.exact_fp32()``."""
    net = train.group_norm_resnet(lab.seed).to(lab.device)
    net.zero_grad(set_to_none=True)
    for x, y in zip(images.tensor_split(k), labels.tensor_split(k)):
        (F.cross_entropy(net(x), y) * (len(x) / len(images))).backward()
    return [float((p.grad - w).abs().max()) for p, w in zip(net.parameters(), want)]


def micro_batch_problem(seen: list[int], batch: int, k: int) -> str:
    """What is wrong with the forward calls ``seen`` as ``k`` micro-batches of ``batch`` ("" if right).

    The model must see the whole batch once, in at least ``k`` forward calls of at most
    ``ceil(batch / k)`` samples each: accumulation exists to bound the activations of one forward.
    """
    largest = -(-batch // k)
    if sum(seen) != batch:
        return (f"the model saw {sum(seen)} samples in {len(seen)} forward call(s) {seen}, not the "
                f"batch's {batch} once")
    if len(seen) < k or max(seen) > largest:
        return (f"the model saw forward batches of {seen} samples: {k} micro-batches of a {batch}-sample "
                f"batch hold at most {largest} each (one forward per micro-batch)")
    return ""


@register("04-accum-match")
def accumulation(namespace, lab):
    """k micro-batches give the large batch's gradients and exactly one optimizer update."""
    step_fn = student(namespace, "accumulate_step", "04")
    size = min(64, lab.profile.image_size)
    images, labels = one_batch(lab, batch_size=2 * lab.profile.batch_size, image_size=size)
    images, labels = images.to(lab.device), labels.to(lab.device)
    reference, model = train.group_norm_resnet(lab.seed).to(lab.device), train.group_norm_resnet(lab.seed).to(lab.device)
    lr, k = 0.1, 3  # 3 does not divide the batch: uneven micro-batches
    with train.exact_fp32():
        want, _ = train.grads_and_stats(reference, reference, images, labels)
        floor = accumulation_floor(want, images, labels, k, lab)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    seen = []  # the batch of every forward call: the micro-batches must be what the model sees
    hook = model.register_forward_pre_hook(lambda module, args: seen.append(int(args[0].shape[0])))
    with train.exact_fp32():
        loss = step_fn(model, optimizer, images, labels, k)
    hook.remove()
    got = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    why = micro_batch_problem(seen, images.shape[0], k)
    allowed = [1e-6 + FLOOR_MARGIN * f for f in floor]  # per gradient: float32 rounding and this device's floor
    why = why or partners.first_mismatch("gradients", got, want, rtol=1e-4, atol=allowed)
    if not why:
        updated = [b - lr * g for b, g in zip(before, want)]
        why = partners.first_mismatch("weights after the update", [p.detach() for p in model.parameters()], updated,
                                      rtol=1e-4, atol=[1e-6 + lr * FLOOR_MARGIN * f for f in floor])
        why = why and f"{why} (one optimizer.step() per large batch, after all micro-batches)"
    if not why and not torch.isfinite(torch.as_tensor(loss)).all():
        why = f"accumulate_step returned a non-finite loss {loss}"
    note = "gradients and the update match one large batch"
    if not why and lab.profile.grades_speed:  # a step's peak means something at the real scale only
        peaks = {}
        for micro in (1, 4):
            net = train.group_norm_resnet(lab.seed).to(lab.device)
            opt = torch.optim.SGD(net.parameters(), lr=lr)
            step_fn(net, opt, images, labels, micro)  # warm-up: the gradients exist from now on
            peaks[micro] = memory.peak_step_bytes(lambda: step_fn(net, opt, images, labels, micro),
                                                  lab.device).peak_bytes
        note += f"; peak {peaks[4] / 2**20:.0f} MiB with 4 micro-batches, {peaks[1] / 2**20:.0f} MiB with 1"
        if peaks[4] > ACCUMULATION_PEAK_FALL * peaks[1]:
            why = (f"4 micro-batches peak at {peaks[4] / 2**20:.0f} MiB, one batch at {peaks[1] / 2**20:.0f} "
                   f"MiB: accumulation must lower the peak (to {ACCUMULATION_PEAK_FALL:g}x or less)")
    return [judge("04-accum-match", float(not why), lab.machine.as_dict(), correct=not why,
                  why_incorrect=why, note="" if why else note)]


