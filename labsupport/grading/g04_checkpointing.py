"""Graded checks of 04_checkpointing: the student's ``checkpointed``, ``SEGMENTS`` and ``accumulate_step``.

- ``04-grad-match``: the checkpointed network gives the plain one's gradients and BatchNorm statistics.
- ``04-activation-ratio``, ``04-peak-ratio``, ``04-fits-budget``, ``04-time-overhead``: it holds
  less in the forward, its step peaks lower, the doubled batch fits the budget, at a bounded cost.
  All four need a step that recomputes: its convolutions (counted, recomputation included) must
  outnumber the plain step's, or it checkpointed nothing, whatever its memory reads. Every timed
  call of the overhead is one step from the same weights, checked against the plain step's from
  there and counted (as many convolutions as an untimed call's).
- ``04-accum-match``: the model sees k micro-batches, which give the large batch's gradients and one
  optimizer update, and (at the real scale) lower the step's peak memory.
- ``04-training-memory``: the student's ``training_bytes`` (weights, gradients and optimizer state of
  training a model, by hand) agrees with what a real optimizer step leaves, counted tensor by tensor,
  for models, optimizers and number sizes they were not shown, and for models too large to count.

Each check is written once, against ``sides``: :class:`Here` holds the steps in this process (the
notebook's self-check); the grader's judge passes its :class:`Remote`, which holds the
student's checkpointed step and accumulation in a worker of their own and the plain step in
another, and gets back numbers and tensors (what :class:`HeldCheckpoint` and
:class:`HeldAccumulation` answer). The accumulation's large-batch gradients and its float32
floor are computed where the check runs: in the grader, by the judge.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import measure, memory, train
from . import judge, one_batch, partners, register, speed, student, with_baseline
from .g03_amp import timed_calls
from .g04_worker import (TRAINING_PARTS, HeldAccumulation, HeldCheckpoint, Here, segments_of,  # noqa: F401
                         step_peak)
from .judge_setup import Judged, MODEL_BYTES, RemoteSides
from .rungs import Recipe, Rung, measured


@register("04-grad-match", "04-activation-ratio", "04-peak-ratio", "04-fits-budget", "04-time-overhead")
def checkpointing(namespace, lab, sides=None):
    """Checkpointing keeps the gradients, halves what the forward holds, fits the larger batch, at a bounded cost."""
    student(namespace, "checkpointed", "04")
    sides = sides or Here(namespace, lab)
    batch = lab.profile.batch_size
    plain, ckpt = sides.checkpoint_step("baseline"), sides.checkpoint_step("candidate")

    # The partner: same gradients and the same BatchNorm running statistics after one backward.
    want = plain.gradients(), plain.statistics()
    got = ckpt.gradients(), ckpt.statistics()
    why = (partners.first_mismatch("gradients", got[0], want[0], rtol=1e-4, atol=1e-5)
           or partners.first_mismatch("BatchNorm running statistics", got[1], want[1], rtol=1e-5, atol=1e-6))
    grad = judge("04-grad-match", float(not why), lab, correct=not why, why_incorrect=why,
                 note=f"{len(want[0])} gradients and {len(want[1])} BatchNorm statistics compared")

    held = {"plain": plain.forward_bytes(), "ckpt": ckpt.forward_bytes()}
    for s in (plain, ckpt):  # warm-up: optimizer state exists before peaks are measured
        s.warm()
    reports, resident = {}, {}
    for name, s, side, double in (("plain", plain, "baseline", False), ("ckpt", ckpt, "candidate", False),
                                  ("plain-2x", plain, "baseline", True), ("ckpt-2x", ckpt, "candidate", True)):
        reports[name], resident[name] = sides.resident_peak(side, lambda: s.peak(double=double), lab.device)

    # From here every call (timed or not) is one step from the lab's seeded fp32 weights, its
    # convolutions counted. Checkpointing holds less because backward recomputes the forward: a
    # step that recomputes nothing (more convolutions than the plain step's) checkpointed nothing,
    # whatever its memory reads, and earns none of the memory and overhead checks.
    for s in (plain, ckpt):
        s.mark()
    untimed, plain_untimed = ckpt.untimed_convolutions(), plain.untimed_convolutions()
    recomputed = "" if untimed > plain_untimed else (
        f"the checkpointed step ran {untimed} convolutions, the plain step {plain_untimed}: backward "
        "recomputed no segment, so nothing was checkpointed (checkpoint each segment of the body, "
        "as torch.utils.checkpoint.checkpoint does)")
    peak = {k: r[0] for k, r in reports.items()}
    # Graded on the count of tensor storages, the same on every device. The allocator's own peaks
    # come beside it: on CUDA the caching allocator's (workspaces and block rounding included),
    # not yet graded, since no GPU run has measured the reference's budget on them; on a CPU,
    # c10's, which sees every tensor the count could be kept from seeing.
    allocator = {k: r[1] for k, r in reports.items() if r[1] >= 0}
    why = why or recomputed or (lab.device.type == "cpu" and allocator_problem(peak, allocator)) \
        or resident_problem(peak, resident)
    partner = dict(correct=not why, why_incorrect=why)

    act = judge("04-activation-ratio", held["ckpt"] / held["plain"], lab, **partner,
                note=f"the forward holds {held['ckpt'] / 2**20:.0f} MiB vs {held['plain'] / 2**20:.0f} MiB")
    budget = memory.BUDGET_FACTOR * peak["plain"]
    mib = {k: v / 2**20 for k, v in peak.items()}
    beside = (f"; the {'CUDA' if lab.device.type == 'cuda' else 'CPU'} allocator's peaks: checkpointed "
              f"{allocator['ckpt-2x'] / 2**20:.0f} MiB, plain {allocator['plain-2x'] / 2**20:.0f} MiB"
              ) if {"ckpt-2x", "plain-2x"} <= set(allocator) else ""
    peak_check = speed(lab, "04-peak-ratio", peak["ckpt"] / peak["plain"], "lower", **partner,
                       note=f"peak {mib['ckpt']:.0f} MiB vs {mib['plain']:.0f} MiB at batch {batch}")
    fits = judge("04-fits-budget", peak["ckpt-2x"] / budget, lab, **partner,
                 note=(f"batch {2 * batch}: checkpointed {mib['ckpt-2x']:.0f} MiB, plain "
                       f"{mib['plain-2x']:.0f} MiB, budget {budget / 2**20:.0f} MiB (tensors counted)"
                       + beside + resident_note(resident)),
                 details={"budget_bytes": budget, **{f"peak_{k}": v for k, v in peak.items()},
                          **{f"allocator_{k}": v for k, v in allocator.items()}})

    # What is timed is checked: each checkpointed call must train as the plain one does from the
    # same weights (read at positions drawn after the call returned, on the clock), running as many
    # convolutions (its recomputation included) as the untimed call of it.
    draws: list[int] = []
    (time_plain, plain_calls), (time_ckpt, ckpt_calls) = timed_calls(plain, draws), timed_calls(ckpt, draws)
    # More rounds than a speedup check where the overhead is judged against a bar, not just reported.
    rounds = max(7, lab.profile.rounds) if lab.profile.grades_speed else lab.profile.rounds
    with sides.checking():
        cmp = measure.compare(time_plain, time_ckpt, lab.device, rounds=rounds,
                              steps_per_round=lab.profile.steps_per_round, focus=sides.focus,
                              verify=getattr(sides, "verify", None))
    sides.focus(None)
    overhead = 1 / cmp.speedup.median - 1
    counted = ckpt.convolutions()
    if len(counted) != len(ckpt_calls):
        timed_ok, timed_why = False, f"the step accounted for {len(counted)} of its {len(ckpt_calls)} timed calls"
    elif why:
        timed_ok, timed_why = False, why
    else:
        for call, n in zip(ckpt_calls, counted):
            call.convolutions = int(n)
        timed_ok, timed_why = partners.updates_alike(ckpt_calls, [c.update for c in plain_calls], ckpt.names(),
                                                     baseline="the plain network's step", convolutions=untimed)
    cost = speed(lab, "04-time-overhead", overhead, "lower", correct=timed_ok, why_incorrect=timed_why,
                 note=f"{cmp.summary()['candidate_ms']:.0f} ms vs {cmp.summary()['baseline_ms']:.0f} ms "
                      f"per step ({cmp.speedup.n} paired rounds, speedup IQR {cmp.speedup.q1:.2f}-"
                      f"{cmp.speedup.q3:.2f})")
    cost = with_baseline(cost, baseline_step_ms=cmp.summary()["baseline_ms"])
    return [grad, act, peak_check, fits, cost]


# The byte counts come from where the step runs, which for the candidate is the student's worker: its
# code could hide tensors from the count. So on a CPU the judge also reads each worker's resident
# memory (anonymous and shared, the kernel's figures, sampled from outside) during the doubled
# batch's step: what the count says checkpointing saved must show there, at least half of it, less
# RESIDENT_SLACK. Two workers' resident memory differs from run to run by tens of MiB whatever they
# hold (96 px, batch 32, class cpu, 2026-11-27: the reference's fell by 3 to 63 MiB where its count
# fell by 38; a network that hid its forward from the count, by -41 to 13 MiB where its count fell
# by 74), so the slack is wide: honest code must never lose on that noise, and what the cross-check
# catches is a hidden saving of more than about 2 * (48 + 15) MiB, not less.
RESIDENT_SLACK = 48 * 2**20


# The count runs where the step runs, which for the candidate is the student's worker, and a
# TorchDispatchMode can be switched off around an op: tensors made there are not counted. c10's CPU
# allocator sees them (memory.cpu_allocator_peak). Its figures differ from the count by what only
# it sees (scratch buffers), and checkpointing removes some of that too, so the allocator's saving
# is at least the count's for honest code (class cpu, 2026-11-27: the reference's count fell by 33.5
# MiB at the cpu profile's doubled batch, the allocator's by 63.0; at the tiny profile, 1.0 and
# 5.3). A network whose forward was hidden from the count saved 65.5 MiB by the count and nothing
# by the allocator. The saving the count claims, at either batch, may exceed the allocator's by
# ALLOCATOR_SLACK at most.
ALLOCATOR_SLACK = 2 * 2**20


def allocator_problem(peak: dict[str, float], allocator: dict[str, float]) -> str:
    """Why the allocator's peaks contradict the counted ones ("" if they do not, or were not read)."""
    for double in ("", "-2x"):
        plain, ckpt = f"plain{double}", f"ckpt{double}"
        if plain not in allocator or ckpt not in allocator:
            continue
        counted, seen = peak[plain] - peak[ckpt], allocator[plain] - allocator[ckpt]
        if counted - seen > ALLOCATOR_SLACK:
            return (f"at the {'doubled batch' if double else 'profile' + chr(39) + 's batch'} the tensors counted in "
                    f"your step fell by "
                    f"{counted / 2**20:.1f} MiB from the plain step's, but what the CPU allocator held by "
                    f"{seen / 2**20:.1f} MiB: the count missed tensors your step holds (a dispatch mode "
                    "switched off, say)")
    return ""


def resident_problem(peak: dict[str, float], resident: dict[str, int | None]) -> str:
    """Why the resident memory read from outside contradicts the counted peaks ("" if it does not,
    or where it was not read)."""
    if resident.get("plain-2x") is None or resident.get("ckpt-2x") is None:
        return ""
    counted, seen = peak["plain-2x"] - peak["ckpt-2x"], resident["plain-2x"] - resident["ckpt-2x"]
    if counted <= RESIDENT_SLACK or seen >= counted / 2 - RESIDENT_SLACK:
        return ""
    return (f"at batch-doubled steps the tensors counted in your step's process fell by {counted / 2**20:.0f} MiB "
            f"from the plain step's, but its resident memory, read from outside, by {seen / 2**20:.0f} MiB: "
            "the count missed tensors your step holds")


def resident_note(resident: dict[str, int | None]) -> str:
    if resident.get("plain-2x") is None or resident.get("ckpt-2x") is None:
        return ""
    return (f"; resident memory read from outside: checkpointed {resident['ckpt-2x'] / 2**20:.0f} MiB, "
            f"plain {resident['plain-2x'] / 2**20:.0f} MiB (each whole process)")


# With 4 micro-batches a step's peak must be at most this fraction of one batch's (the reference at
# 64 px, batch 64, class cpu: 79 MiB against 140 MiB, 0.56). The one batch's step is the lab's own,
# counted where the check runs: a step given 1 micro-batch is the student's, and could peak higher
# on purpose.
ACCUMULATION_PEAK_FALL = 0.85
# The count runs in the student's worker (see ALLOCATOR_SLACK), so on a CPU c10's allocator is read
# beside it: what it held beyond the count, with 4 micro-batches, may exceed what it holds beyond the
# count in the lab's one-batch step by this much. The reference's excess is 36.1 MiB whatever the
# micro-batch count (2, 4, 8), the one-batch step's 29.6 (cpu profile, 64 px, 64 samples) or 26.6
# (64 px, 32 samples), class cpu, 2026-11-27: 6.5 and 9.5 MiB apart; a whole-batch step kept from
# the count, about 80 MiB.
ACCUMULATION_UNSEEN_SLACK = 16 * 2**20


def one_batch_step(images: torch.Tensor, labels: torch.Tensor):
    """The lab's own step on the whole batch, as an accumulation with one micro-batch runs it."""
    def step(net, opt):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(images), labels).backward()
        opt.step()
    return step


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
def accumulation(namespace, lab, sides=None):
    """k micro-batches give the large batch's gradients and exactly one optimizer update."""
    student(namespace, "accumulate_step", "04")
    sides = sides or Here(namespace, lab)
    size = min(64, lab.profile.image_size)
    images, labels = one_batch(lab, batch_size=2 * lab.profile.batch_size, image_size=size, augment=False)
    images, labels = images.to(lab.device), labels.to(lab.device)
    reference = train.group_norm_resnet(lab.seed).to(lab.device)
    lr, k = 0.1, 3  # 3 does not divide the batch: uneven micro-batches
    with train.exact_fp32():
        want, _ = train.grads_and_stats(reference, reference, images, labels)
        floor = accumulation_floor(want, images, labels, k, lab)
    before = [p.detach().clone() for p in train.group_norm_resnet(lab.seed).to(lab.device).parameters()]
    done = sides.accumulate(k=k, lr=lr, size=size)
    device = lambda tensors: [t.to(lab.device) for t in tensors]  # noqa: E731
    why = micro_batch_problem(list(done.seen()), images.shape[0], k)
    allowed = [1e-6 + FLOOR_MARGIN * f for f in floor]  # per gradient: float32 rounding and this device's floor
    why = why or partners.first_mismatch("gradients", device(done.gradients()), want, rtol=1e-4, atol=allowed)
    if not why:
        updated = [b - lr * g for b, g in zip(before, want)]
        why = partners.first_mismatch("weights after the update", device(done.weights()), updated,
                                      rtol=1e-4, atol=[1e-6 + lr * FLOOR_MARGIN * f for f in floor])
        why = why and f"{why} (one optimizer.step() per large batch, after all micro-batches)"
    loss = done.loss()
    if not why and not math.isfinite(loss):
        why = f"accumulate_step returned a non-finite loss {loss}"
    note = "gradients and the update match one large batch"
    if not why and lab.profile.grades_speed:  # a step's peak means something at the real scale only
        (four, four_seen), (one, one_seen) = done.micro_peak(micro=4), step_peak(one_batch_step(images, labels), lab, lr)
        note += f"; peak {four / 2**20:.0f} MiB with 4 micro-batches, {one / 2**20:.0f} MiB for the lab's one-batch step"
        if four > ACCUMULATION_PEAK_FALL * one:
            why = (f"4 micro-batches peak at {four / 2**20:.0f} MiB, the lab's one-batch step at {one / 2**20:.0f} "
                   f"MiB: accumulation must lower the peak (to {ACCUMULATION_PEAK_FALL:g}x or less)")
        elif four_seen >= 0 and one_seen > 0:  # on a CPU: the allocator saw what the count saw, and no more
            note += f" (the CPU allocator's: {four_seen / 2**20:.0f} and {one_seen / 2**20:.0f} MiB)"
            unseen = (four_seen - four) - (one_seen - one)
            if unseen > ACCUMULATION_UNSEEN_SLACK:
                why = (f"the tensors counted in your step with 4 micro-batches peak at {four / 2**20:.0f} MiB, but "
                       f"what the CPU allocator held at {four_seen / 2**20:.0f} MiB: {unseen / 2**20:.0f} MiB more "
                       "than the count saw, beyond what the lab's one-batch step shows "
                       f"({(one_seen - one) / 2**20:.0f} MiB): the count missed tensors your step holds")
    return [judge("04-accum-match", float(not why), lab, correct=not why,
                  why_incorrect=why, note="" if why else note)]


# --- 04-training-memory: the memory of training, by hand, against a count -------------------------

_MODELS = {"ResNet-18": lambda seed: train.build_model(seed=seed),
           "MLP": lambda seed: torch.nn.Sequential(torch.nn.Linear(37, 53), torch.nn.ReLU(), torch.nn.Linear(53, 11)),
           "convnet": lambda seed: torch.nn.Sequential(torch.nn.Conv2d(3, 24, 3, bias=False), torch.nn.BatchNorm2d(24),
                                                       torch.nn.Conv2d(24, 40, 5), torch.nn.Flatten(),
                                                       torch.nn.Linear(40 * 6 * 6, 7))}
# What the check counts: (model, its dtype, optimizer). None of them is the one 04's table shows
# with Adam in float32 alone; BatchNorm's running statistics are buffers, not parameters, and no
# optimizer keeps state for them.
COUNTED = (("ResNet-18", torch.float32, "adam"), ("ResNet-18", torch.float32, "momentum"),
           ("MLP", torch.float32, "sgd"), ("MLP", torch.bfloat16, "adam"), ("convnet", torch.bfloat16, "momentum"))
# And carried to models too large to count here, from the bytes per parameter counted above.
CARRIED = ((1_500_000_000, "adam", 4), (7_000_000_000, "momentum", 2), (70_000_000_000, "sgd", 4))


def counted_training_bytes(model: torch.nn.Module, optimizer: str) -> dict[str, int]:
    """One update of ``model``'s parameters by ``optimizer`` ("sgd", "momentum" or "adam"), from no
    state, on the CPU: the bytes its weights, its gradients and the optimizer's state then hold,
    counted tensor by tensor. Adam's step counters are 0-d (one number per tensor, not per
    parameter) and left out, as 04 says."""
    params = list(model.parameters())
    opt = (torch.optim.Adam(params, foreach=False) if optimizer == "adam" else
           torch.optim.SGD(params, lr=0.1, momentum=0.9 if optimizer == "momentum" else 0.0))
    sum(p.float().sum() for p in params).backward()  # a gradient for every parameter
    opt.step()
    nbytes = lambda tensors: sum(t.numel() * t.element_size() for t in tensors)  # noqa: E731
    return {"weights": nbytes(params), "gradients": nbytes(p.grad for p in params),
            "optimizer state": nbytes(t for s in opt.state.values() for t in s.values()
                                      if torch.is_tensor(t) and t.dim() > 0)}


def training_memory_cases(seed: int) -> list[tuple[tuple[int, str, int], dict[str, int]]]:
    """``((parameters, optimizer, bytes per number), the right answer)`` for every case the check
    asks: counted on :data:`COUNTED`'s models, then :data:`CARRIED` from the bytes per parameter
    those counts gave (each a whole number of bytes, or the count is not what 04 teaches)."""
    torch.manual_seed(seed)
    cases, per_parameter = [], {}
    for name, dtype, optimizer in COUNTED:
        model = _MODELS[name](seed).to(dtype)
        parameters, size = sum(p.numel() for p in model.parameters()), dtype.itemsize
        counted = counted_training_bytes(model, optimizer)
        cases.append(((parameters, optimizer, size), counted))
        per_parameter[optimizer] = {part: counted[part] // (parameters * size) for part in TRAINING_PARTS}
        assert all(counted[part] == per_parameter[optimizer][part] * parameters * size for part in TRAINING_PARTS)
    for parameters, optimizer, size in CARRIED:
        cases.append(((parameters, optimizer, size),
                      {part: n * parameters * size for part, n in per_parameter[optimizer].items()}))
    return cases


@register("04-training-memory")
def training_memory(namespace, lab, sides=None):
    """The student's ``training_bytes`` gives each part of training memory as a real optimizer step
    holds it, on models, optimizers and number sizes it was not shown."""
    student(namespace, "training_bytes", "04")
    sides = sides or Here(namespace, lab)
    cases = training_memory_cases(lab.seed)
    answers = sides.training_bytes([case for case, _ in cases])  # every answer before any comparison
    wrong = [] if len(answers) == len(cases) else [f"{len(answers)} answers to {len(cases)} cases"]
    for ((parameters, optimizer, size), want), got in zip(cases, answers):
        off = [f"{part} {got[part]:,.0f} (counted {want[part]:,})" for part in TRAINING_PARTS
               if not abs(float(got[part]) - want[part]) <= 1e-4 * want[part] + 1]
        if off:
            wrong.append(f"training_bytes({parameters:,}, {optimizer!r}, {size}): " + ", ".join(off))
    return [judge("04-training-memory", float(not wrong), lab, correct=not wrong,
                  why_incorrect="; ".join(wrong[:3]) + (f"; and {len(wrong) - 3} more" if len(wrong) > 3 else ""),
                  note=f"{len(COUNTED)} optimizer steps counted tensor by tensor ({', '.join(sorted({o for _, _, o in COUNTED}))}; "
                       f"float32 and bfloat16), {len(CARRIED)} models too large to count")]


from .g04_worker import RUNG  # noqa: E402,F401 (its rung is declared beside what its worker builds)


class Remote(RemoteSides):
    """04's judge side: each step held in its side's worker (:class:`~.g04_worker.Side`)."""

    def checkpoint_step(self, side: str):
        """The plain step (baseline) or the student's checkpointed one (candidate), held in ``side``'s worker."""
        return self.sides.held(side, "checkpoint_step", asked=HeldCheckpoint.ASKED)

    def accumulate(self, *, k: int, lr: float, size: int):
        """The student's ``accumulate_step`` after one call, held in their worker."""
        return self.sides.held("candidate", "accumulate", asked=HeldAccumulation.ASKED, k=k, lr=lr, size=size)

    def training_bytes(self, cases) -> list[dict[str, float]]:
        """The student's ``training_bytes`` on each case, in their worker: a dict of numbers per case."""
        answers = self.sides.ask("candidate", "training_bytes", cases=[list(c) for c in cases])["value"]
        if not isinstance(answers, list) or not all(
                isinstance(a, dict) and all(isinstance(a.get(p), (int, float)) for p in TRAINING_PARTS) for a in answers):
            raise ValueError("training_bytes's worker answered something other than a number per part and case")
        return answers


# How the judge sets up 04's checks: the lab's plain network in a worker of its own; a model's state crosses.
JUDGED = Judged(baseline=True, buffer_floor=MODEL_BYTES + 2**20, compared=("04-time-overhead",), remote=Remote)
