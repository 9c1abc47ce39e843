"""The graded checks of each notebook: call the student's code, measure it now, judge it.

A notebook's graded cells run ``grading.fresh().checks.run("02", globals())``: a private copy of
labsupport (so no notebook cell can have replaced what measures) calls the functions the student
wrote, re-measures them against the baseline on this machine, and returns one
:class:`~labsupport.grading.CheckResult` per check. The self-check ``ls.check("02", globals())``
runs exactly the same code and shows the table. Each check pairs its measurement with a
correctness partner (same data, weights that train and stay finite, same accuracy), and turns an
exception in the student's code into a failed check with the error, never a crashed notebook.

Which function each notebook asks for (the notebook's markdown gives the exact contract):

- 01: ``measure_throughput(step, device, *, warmup, steps, samples_per_step)`` and
  ``diagnose(breakdown)``; the torch.profiler trace ``results/traces/01-trace.json``.
- 02: ``make_fast_loader(lab, split="train", augment=True)``.
- 03: ``choose_precision(machine)`` and ``amp_train_step(model, optimizer, scaler, images,
  labels, dtype)``.
- 04: ``checkpointed(model, segments)``, ``SEGMENTS`` and ``accumulate_step(model, optimizer,
  images, labels, micro_batches)``.
- 05: ``compile_inference(model)`` and ``break_even_steps(compile_s, eager_ms, compiled_ms)``.
- 06: ``assemble_ladder(frame)``; the HTML report at ``report.default_path()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from . import grading, hardware, measure, memory, pipeline, results, train
from .grading import CheckResult

_CHECKS: dict[str, list[tuple[tuple[str, ...], Callable]]] = {}


class StudentCodeError(RuntimeError):
    """The student's function is missing or broke its contract; the message says what to fix."""


def _check(*ids: str):
    """Register a check function producing the results ``ids`` for notebook ``ids[0][:2]``."""
    def register(fn):
        _CHECKS.setdefault(ids[0][:2], []).append((ids, fn))
        return fn
    return register


def _student(namespace: dict, name: str, notebook: str) -> Callable:
    fn = namespace.get(name)
    if not callable(fn):
        raise StudentCodeError(f"`{name}` is not defined: write it in notebook {notebook}'s solution "
                               "cell and run that cell before the checks.")
    return fn


def _lab() -> hardware.Lab:
    device = hardware.pick_device()
    machine = hardware.describe_machine(device)
    return hardware.Lab(device, machine, hardware.profile_for(machine.device_class), seed=0)


def _speed(lab: hardware.Lab, check: str, measured: float | None, better: str = "higher",
           **partner) -> CheckResult:
    """judge() for a check that needs the real scale (speed, a step's peak), which the tiny test
    profile never grades: at 32 px the lesson does not show (a step's peak is its gradients)."""
    if not lab.profile.grades_speed and partner.get("correct", True) and partner.get("optimised", True):
        return CheckResult(check, measured, None, better, lab.machine.device_class, "n/a",
                           f"profile {lab.profile.name} is for tests and does not grade speed or "
                           f"peaks; {partner.get('note', '')}".rstrip("; "), partner.get("details") or {})
    return grading.judge(check, measured, lab.machine.as_dict(), **partner)


def run(notebook: str, namespace: dict, *, only: tuple[str, ...] | None = None,
        skip: tuple[str, ...] = (), lab: hardware.Lab | None = None) -> dict[str, CheckResult]:
    """Run notebook ``notebook``'s graded checks on the code in ``namespace`` (Used by: 01-06).

    Returns ``{check id: CheckResult}``. A check whose code raised fails with the error as its
    note; the other checks still run. ``only`` / ``skip`` select checks by id (a notebook may
    grade an expensive check where it is taught, and the rest at the end).
    """
    if notebook not in _CHECKS:
        raise ValueError(f"No graded checks for notebook {notebook!r}; notebooks with checks: "
                         f"{', '.join(sorted(_CHECKS))}.")
    lab = lab or _lab()
    out: dict[str, CheckResult] = {}
    for ids, fn in _CHECKS[notebook]:
        if (only is not None and not set(ids) & set(only)) or set(ids) <= set(skip):
            continue
        try:
            found = fn(namespace, lab)
        except Exception as err:  # the student's code, whatever it raised, costs this check only
            why = f"{type(err).__name__}: {err}"
            found = [CheckResult(i, None, None, "", lab.machine.device_class, "fail", why) for i in ids]
        out.update({r.check: r for r in found})
    return out


# ---------------------------------------------------------------------------------------------
# 01_profile

def _known_workload(slow_calls: int) -> Callable[[], None]:
    """A step of known duration (20 ms) whose first calls are slow (250 ms), as a real first
    training step is (allocator growth, autotuning, lazy initialisation). It sleeps rather than
    computes, so its duration does not depend on how busy the machine's cores are."""
    calls = 0

    def step():
        nonlocal calls
        calls += 1
        time.sleep(0.25 if calls <= slow_calls else 0.02)
    return step


@_check("01-throughput-error")
def throughput(namespace, lab):
    """The student's measure_throughput agrees with measure.time_steps on a known workload."""
    fn = _student(namespace, "measure_throughput", "01")
    warmup, steps, samples = 3, 20, 32
    ref = measure.time_steps(_known_workload(warmup), lab.device, warmup=warmup, steps=steps,
                             samples_per_step=samples)
    got = fn(_known_workload(warmup), lab.device, warmup=warmup, steps=steps,
             samples_per_step=samples)
    missing = {"images_per_s", "median_ms", "p50_ms", "p95_ms", "p99_ms"} - set(got or {})
    if missing:
        raise StudentCodeError(f"measure_throughput must return a dict with {', '.join(sorted(missing))}")
    errors = {
        "median_ms": got["median_ms"] / ref.median_ms - 1,
        "p95_ms": got["p95_ms"] / ref.percentile_ms(95) - 1,
        "images_per_s": got["images_per_s"] / ref.samples_per_s - 1,
    }
    worst = max(errors, key=lambda k: abs(errors[k]))
    note = (f"worst: {worst} off by {errors[worst]:+.0%} (reference median {ref.median_ms:.1f} ms, "
            f"p95 {ref.percentile_ms(95):.1f} ms, {ref.samples_per_s:.0f} images/s)")
    return [grading.judge("01-throughput-error", abs(errors[worst]), lab.machine.as_dict(), note=note)]


@_check("01-throughput-sync")
def throughput_sync(namespace, lab):
    """On CUDA, measure_throughput times the kernels, not their launches (synchronises)."""
    fn = _student(namespace, "measure_throughput", "01")
    if lab.device.type != "cuda":
        # Not applicable here, but the function must still run and answer (no free points).
        got = fn(lambda: None, lab.device, warmup=1, steps=3, samples_per_step=1)
        if not isinstance(got, dict) or "median_ms" not in got:
            raise StudentCodeError("measure_throughput must return a dict with median_ms")
        return [grading.judge("01-throughput-sync", None, lab.machine.as_dict())]
    a = torch.randn(4096, 4096, device=lab.device)

    def work():  # queued asynchronously: the host returns long before the GPU is done
        for _ in range(16):
            a @ a
    ref = measure.time_steps(work, lab.device, warmup=3, steps=20)
    got = fn(work, lab.device, warmup=3, steps=20, samples_per_step=1)
    ratio = got["median_ms"] / ref.median_ms
    return [grading.judge("01-throughput-sync", ratio, lab.machine.as_dict(),
                          note=f"yours {got['median_ms']:.2f} ms vs CUDA events {ref.median_ms:.2f} ms")]


_GROUPS = {"data": ("data wait",), "transfer": ("host to device",), "compute": ("forward", "backward"),
           "optimizer": ("optimizer",)}

# Crafted breakdowns (ms per phase) with their bottleneck. Some need the grouping: the largest
# single phase is not always the bottleneck.
_CASES = [
    ({"data wait": 70, "host to device": 2, "forward": 10, "backward": 15, "optimizer": 3}, "data"),
    ({"data wait": 5, "host to device": 3, "forward": 30, "backward": 55, "optimizer": 7}, "compute"),
    ({"data wait": 20, "host to device": 45, "forward": 15, "backward": 15, "optimizer": 5}, "transfer"),
    ({"data wait": 40, "host to device": 1, "forward": 30, "backward": 28, "optimizer": 1}, "compute"),
    ({"data wait": 10, "host to device": 5, "forward": 12, "backward": 13, "optimizer": 60}, "optimizer"),
    ({"data wait": 0.7, "host to device": 0.01, "forward": 0.1, "backward": 0.15, "optimizer": 0.04}, "data"),
]


def _bottleneck(breakdown: dict[str, float]) -> str:
    return max(_GROUPS, key=lambda g: sum(breakdown.get(p, 0.0) for p in _GROUPS[g]))


@_check("01-diagnose")
def diagnose(namespace, lab):
    """diagnose() names the right bottleneck on crafted breakdowns and on this machine, measured now."""
    fn = _student(namespace, "diagnose", "01")
    step = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    batches = pipeline.forever(pipeline.naive_loader(lab.profile, seed=lab.seed))
    per_step = train.phase_breakdown(batches, step, steps=3, warmup=1)
    here = {p: float(np.median(v)) for p, v in per_step.items()}
    cases = [*_CASES, (here, _bottleneck(here))]
    wrong = [(b, want, got) for b, want in cases if (got := fn(dict(b))) != want]
    note = "; ".join(f"{({k: round(v, 1) for k, v in b.items()})} is {want!r}, you said {got!r}"
                     for b, want, got in wrong[:2])
    return [grading.judge("01-diagnose", 1 - len(wrong) / len(cases), lab.machine.as_dict(),
                          note=note or f"this machine, measured now: {cases[-1][1]}")]


def _process_start_s() -> float | None:
    try:
        import psutil
        return psutil.Process().create_time()
    except Exception:  # no psutil: the freshness test is skipped, the content test still runs
        return None


@_check("01-trace")
def trace(namespace, lab):
    """results/traces/01-trace.json was written by this kernel, parses, and holds convolution events."""
    path = results.results_dir() / "traces" / "01-trace.json"
    if not path.is_file():
        raise StudentCodeError(f"{path} does not exist: run the torch.profiler cell of 01, which "
                               "exports the trace there.")
    started = _process_start_s()
    if started is not None and path.stat().st_mtime < started - 1:
        raise StudentCodeError(f"{path} is older than this kernel: run the torch.profiler cell again.")
    try:
        events = json.loads(path.read_text())["traceEvents"]
    except (ValueError, KeyError, TypeError) as err:
        raise StudentCodeError(f"{path} is not a Chrome trace ({err}); export it with "
                               "prof.export_chrome_trace(path).") from None
    convs = sum(1 for e in events if "conv" in str(e.get("name", "")).lower())
    return [grading.judge("01-trace", convs, lab.machine.as_dict(),
                          note=f"{len(events)} events, {convs} of them convolutions")]


# ---------------------------------------------------------------------------------------------
# 02_data_loading

# The fast loader's data wait must be at most this fraction of the naive loader's, measured in the
# same check (reference on cpu-bf16: 4.5-5.1 ms against about 25 ms, i.e. 0.2).
WAIT_FALL = 0.5


def _sync_next(it, device):
    def call():
        next(it)
        measure.sync(device)
    return call


@_check("02-loader-speedup", "02-data-wait-share")
def loader(namespace, lab):
    """The student's loader delivers the naive loader's data, faster, and the step stops waiting."""
    make = _student(namespace, "make_fast_loader", "02")
    profile = lab.profile
    # Correctness first: the same images and labels with augmentation off, every sample per epoch.
    t0 = time.perf_counter()
    ref_val = pipeline.naive_loader(profile, split="val", augment=False)
    same, why = grading.same_batches(ref_val, make(lab, split="val", augment=False), max_batches=4)
    fast_train = make(lab, split="train", augment=True)
    build_s = time.perf_counter() - t0
    if same:
        expected = torch.as_tensor(pipeline.naive_loader(profile, split="train").dataset.targets)
        batches = list(fast_train)
        same, why = grading.same_epoch_labels(expected, torch.cat([y.cpu() for _, y in batches]),
                                             profile.batch_size)
        shapes = {tuple(x.shape[1:]) for x, _ in batches} | {x.dtype for x, _ in batches}
        want = {(3, profile.image_size, profile.image_size), torch.float32}
        if same and shapes != want:
            same, why = False, f"augmented batches have shapes/dtypes {shapes}, expected {want}"
    partner = dict(correct=same, why_incorrect=why)

    naive = pipeline.forever(pipeline.naive_loader(profile, seed=lab.seed))
    fast = pipeline.forever(fast_train)
    # A long warm-up: the first fetches after the loaders are built run slow. With one warm-up
    # fetch the reference measured 1.5-5.3x in fresh processes (cpu-bf16); with 8, 4.9-5.2x.
    cmp = measure.compare(_sync_next(naive, lab.device), _sync_next(fast, lab.device), lab.device,
                          rounds=profile.rounds, steps_per_round=2 * profile.steps_per_round,
                          warmup=4 * profile.steps_per_round)
    speed = _speed(lab, "02-loader-speedup", cmp.speedup.median, **partner)
    speed = dataclasses.replace(speed, note=(speed.note + "; " if speed.note else "")
                                + f"{cmp}; building your loaders took {build_s:.1f} s")

    step = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    per_step = train.phase_breakdown(fast, step, steps=profile.measure_steps, warmup=1, non_blocking=True)
    medians = {p: float(np.median(v)) for p, v in per_step.items()}
    share = medians["data wait"] / sum(medians.values())
    note = f"data wait {medians['data wait']:.1f} ms of a {sum(medians.values()):.0f} ms step"
    fell = dict(optimised=True)
    if profile.grades_speed:
        # On a CPU the naive loader's wait can already sit under the bar (7-8% of a cpu-bf16 step),
        # so the wait must also have fallen against the naive loader's, measured now, same step.
        naive_wait = float(np.median(train.phase_breakdown(naive, step, steps=profile.measure_steps,
                                                           warmup=1)["data wait"]))
        note += f"; the naive loader's: {naive_wait:.1f} ms"
        fell = dict(optimised=medians["data wait"] <= WAIT_FALL * naive_wait,
                    why_not_optimised=f"the step waits {medians['data wait']:.1f} ms for data, against "
                                      f"{naive_wait:.1f} ms with the naive loader measured now; it must fall "
                                      f"to {WAIT_FALL:g}x that or less")
    wait = _speed(lab, "02-data-wait-share", share, "lower", **partner, **fell, note=note)
    return [speed, wait]


# ---------------------------------------------------------------------------------------------
# 03_amp

class StudentAmpStep:
    """The student's ``amp_train_step`` around a fresh seeded ResNet-18, SGD and GradScaler.

    Quacks like :class:`~labsupport.train.TrainStep` (``model``, ``device``, ``autocast``,
    ``to_device``, call), so the lab's timing, memory and evaluation code measures it unchanged.
    """

    def __init__(self, fn: Callable, dtype: torch.dtype | None, channels_last: bool,
                 device: torch.device, seed: int = 0, lr: float = train.StepConfig.lr,
                 init_scale: float = 2.0 ** 16):
        self.fn, self.dtype, self.channels_last, self.device = fn, dtype, channels_last, device
        self.model = train.build_model(seed=seed).to(device)
        if channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=train.StepConfig.momentum)
        self.scaler = torch.amp.GradScaler(device.type, init_scale=init_scale,
                                           enabled=(dtype is torch.float16))
        self.autocast = (torch.autocast(device.type, dtype=dtype) if dtype is not None
                         else contextlib.nullcontext())

    def to_device(self, images, labels, non_blocking: bool = False):
        images = images.to(self.device, non_blocking=non_blocking)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels.to(self.device, non_blocking=non_blocking)

    def __call__(self, images, labels):
        self.model.train()
        return self.fn(self.model, self.optimizer, self.scaler, images, labels, self.dtype)


def _precision(namespace, lab) -> tuple[torch.dtype | None, bool]:
    choice = _student(namespace, "choose_precision", "03")(lab.machine)
    try:
        dtype, channels_last = choice["dtype"], bool(choice["channels_last"])
    except (TypeError, KeyError):
        raise StudentCodeError("choose_precision must return {'dtype': ..., 'channels_last': ...}, "
                               f"not {choice!r}") from None
    if dtype not in (None, torch.float16, torch.bfloat16):
        raise StudentCodeError(f"choose_precision chose dtype {dtype!r}: use torch.float16, "
                               "torch.bfloat16 or None.")
    return dtype, channels_last


def _one_batch(lab, batch_size=None, image_size=None, seed=0):
    profile = dataclasses.replace(lab.profile, batch_size=batch_size or lab.profile.batch_size,
                                  image_size=image_size or lab.profile.image_size)
    images, labels = next(iter(pipeline.naive_loader(profile, seed=seed)))
    return images, labels


@_check("03-amp-speedup", "03-activation-ratio")
def amp_speed_and_memory(namespace, lab):
    """A mixed-precision step that trains is faster than fp32 and saves fewer activation bytes."""
    fn = _student(namespace, "amp_train_step", "03")
    dtype, channels_last = _precision(namespace, lab)
    images, labels = _one_batch(lab)
    fp32 = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    amp = StudentAmpStep(fn, dtype, channels_last, lab.device, seed=lab.seed)
    ref_x, ref_y = fp32.to_device(images, labels)
    amp_x, amp_y = amp.to_device(images, labels)
    # Partner 1: the first step's loss matches fp32's (same weights, same batch).
    ref_loss, amp_loss = float(fp32(ref_x, ref_y)), float(amp(amp_x, amp_y))
    correct, why = True, ""
    if not math.isfinite(amp_loss) or abs(amp_loss - ref_loss) > 0.02 * abs(ref_loss) + 0.02:
        correct, why = False, f"first-step loss {amp_loss:.4f}, fp32 gives {ref_loss:.4f}"
    # Partner 2: the step keeps training, with finite weights.
    if correct:
        correct, why = grading.step_trains(amp, amp_x, amp_y, steps=2)
    cmp = measure.compare(lambda: fp32(ref_x, ref_y), lambda: amp(amp_x, amp_y), lab.device,
                          rounds=lab.profile.rounds, steps_per_round=lab.profile.steps_per_round)
    speed = _speed(lab, "03-amp-speedup", cmp.speedup.median, correct=correct, why_incorrect=why)
    speed = dataclasses.replace(speed, note=(speed.note + "; " if speed.note else "") + str(cmp))
    ref_bytes = memory.saved_activation_bytes(lambda: fp32(ref_x, ref_y), fp32.model)
    amp_bytes = memory.saved_activation_bytes(lambda: amp(amp_x, amp_y), amp.model)
    mem = grading.judge("03-activation-ratio", amp_bytes / ref_bytes, lab.machine.as_dict(),
                        correct=correct, why_incorrect=why,
                        note=f"{amp_bytes / 2**20:.0f} MiB saved for backward vs {ref_bytes / 2**20:.0f} MiB in fp32")
    return [speed, mem]


# The accuracy-parity run: long enough that both runs converge, since the gap between two short,
# unconverged runs is mostly noise, and at a reduced image size so it fits the time budget (mixed
# precision's rounding does not depend on the image size).
PARITY_IMAGE_SIZE = 32
PARITY_BATCH_SIZE = 64
PARITY_STEPS = 160
PARITY_MAX_LR = 0.05


def parity_run(step, train_images, train_labels, val_images, val_labels, *, steps: int,
               batch_size: int, seed: int = 0, progress: bool = False) -> float:
    """Train ``step`` for ``steps`` steps (one-cycle LR, random flips) and return val accuracy.

    Data order and flips come from ``seed``, so two steps trained with the same seed see the same
    batches. Used by: the 03 accuracy check and notebook 03.
    """
    sched = torch.optim.lr_scheduler.OneCycleLR(step.optimizer, max_lr=PARITY_MAX_LR,
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
    batches = zip(val_images.split(256), val_labels.split(256))
    return train.evaluate(step, batches)


@_check("03-accuracy-gap")
def amp_accuracy(namespace, lab):
    """After the same short training run, mixed precision's accuracy is within tolerance of fp32's."""
    fn = _student(namespace, "amp_train_step", "03")
    dtype, channels_last = _precision(namespace, lab)
    size = min(PARITY_IMAGE_SIZE, lab.profile.image_size)
    steps = PARITY_STEPS if lab.profile.grades_speed else 10
    (xt, yt), (xv, yv) = ((pipeline.normalize(x), y) for x, y in
                          (pipeline.decode_once(s, size=size, progress=False) for s in ("train", "val")))
    kw = dict(steps=steps, batch_size=PARITY_BATCH_SIZE, seed=lab.seed)
    fp32_acc = parity_run(train.make_step(train.StepConfig(), lab.device, seed=lab.seed), xt, yt, xv, yv, **kw)
    amp_acc = parity_run(StudentAmpStep(fn, dtype, channels_last, lab.device, seed=lab.seed), xt, yt, xv, yv, **kw)
    gap = 100 * (fp32_acc - amp_acc)
    note = f"fp32 {100 * fp32_acc:.1f}%, yours {100 * amp_acc:.1f}% after {steps} steps at {size} px"
    details = {"accuracy_fp32": fp32_acc, "accuracy": amp_acc, "steps": steps, "image_size": size}
    if not lab.profile.grades_speed:  # too brief to compare accuracy; the step must still train
        step = StudentAmpStep(fn, dtype, channels_last, lab.device, seed=lab.seed)
        ok, why = grading.step_trains(step, *step.to_device(xt[:PARITY_BATCH_SIZE], yt[:PARITY_BATCH_SIZE]), steps=2)
        return [CheckResult("03-accuracy-gap", gap, None, "lower", lab.machine.device_class,
                            "n/a" if ok else "fail",
                            f"profile {lab.profile.name} trains too briefly to compare accuracy; {note}"
                            if ok else f"correctness check failed: {why}", details)]
    return [grading.judge("03-accuracy-gap", gap, lab.machine.as_dict(), note=note, details=details)]


@_check("03-fp16-scaler")
def fp16_scaler(namespace, lab):
    """In float16, amp_train_step uses the GradScaler: an overflowing step is skipped, not applied."""
    fn = _student(namespace, "amp_train_step", "03")
    # A modest initial scale, so that the normal steps after the overflow train at once instead
    # of first halving the scale down from 65536 (an untrained ResNet's gradients overflow there).
    step = StudentAmpStep(fn, torch.float16, False, lab.device, seed=lab.seed, init_scale=2.0 ** 8)
    images, labels = _one_batch(lab, batch_size=4, image_size=32)
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
        ok, why = grading.step_trains(step, images, labels, steps=5)
    return [grading.judge("03-fp16-scaler", float(ok), lab.machine.as_dict(), correct=ok, why_incorrect=why,
                          note="" if ok else why)]


# ---------------------------------------------------------------------------------------------
# 04_checkpointing

BUDGET_FACTOR = 1.25  # 04's memory budget: 1.25 x the peak of the baseline step at the profile's batch


def _grads_and_stats(net, model, images, labels):
    model.zero_grad(set_to_none=True)
    F.cross_entropy(net(images), labels).backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    stats = [b.detach().clone() for name, b in model.named_buffers() if "running" in name]
    return grads, stats


def _first_mismatch(name: str, got: list, want: list, rtol: float, atol: float) -> str:
    for i, (g, w) in enumerate(zip(got, want)):
        try:
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
        except AssertionError as err:
            return f"{name} #{i} differs: {str(err).splitlines()[-1].strip() or err}"
    return "" if len(got) == len(want) else f"{len(got)} {name} instead of {len(want)}"


def _segments(namespace) -> int:
    segments = namespace.get("SEGMENTS")
    if not isinstance(segments, int) or not 1 <= segments <= 9:
        raise StudentCodeError(f"SEGMENTS = {segments!r}: set it to the number of checkpointed segments "
                               "you chose, from 1 to 9 (ResNet-18's body has 9 units).")
    return segments


@_check("04-grad-match", "04-activation-ratio", "04-peak-ratio", "04-fits-budget", "04-time-overhead")
def checkpointing(namespace, lab):
    """Checkpointing keeps the gradients, halves what the forward holds, fits the larger batch, at a bounded cost."""
    wrap = _student(namespace, "checkpointed", "04")
    segments = _segments(namespace)
    machine, batch = lab.machine.as_dict(), lab.profile.batch_size
    images, labels = _one_batch(lab, batch_size=2 * batch)
    images, labels = images.to(lab.device), labels.to(lab.device)
    small_x, small_y = images[:batch], labels[:batch]

    plain = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    model = train.build_model(seed=lab.seed)
    ckpt = train.TrainStep(model, train.StepConfig(), lab.device, net=wrap(model, segments))

    # The partner: same gradients and the same BatchNorm running statistics after one backward.
    want = _grads_and_stats(plain.net, plain.model, small_x, small_y)
    got = _grads_and_stats(ckpt.net, ckpt.model, small_x, small_y)
    why = (_first_mismatch("gradients", got[0], want[0], rtol=1e-4, atol=1e-5)
           or _first_mismatch("BatchNorm running statistics", got[1], want[1], rtol=1e-5, atol=1e-6))
    partner = dict(correct=not why, why_incorrect=why)
    grad = grading.judge("04-grad-match", float(not why), machine, **partner,
                         note=f"{len(want[0])} gradients and {len(want[1])} BatchNorm statistics compared")

    held = {name: memory.forward_bytes(lambda s=s: F.cross_entropy(s.net(small_x), small_y), lab.device)
            for name, s in (("plain", plain), ("ckpt", ckpt))}
    act = grading.judge("04-activation-ratio", held["ckpt"] / held["plain"], machine, **partner,
                        note=f"the forward holds {held['ckpt'] / 2**20:.0f} MiB vs {held['plain'] / 2**20:.0f} MiB")

    for s in (plain, ckpt):  # warm-up: optimizer state exists before peaks are measured
        s(small_x, small_y)
    peak = {name: memory.peak_step_bytes(lambda s=s, x=x, y=y: s(x, y), lab.device).peak_bytes
            for name, s, x, y in (("plain", plain, small_x, small_y), ("ckpt", ckpt, small_x, small_y),
                                  ("plain-2x", plain, images, labels), ("ckpt-2x", ckpt, images, labels))}
    budget = BUDGET_FACTOR * peak["plain"]
    mib = {k: v / 2**20 for k, v in peak.items()}
    peak_check = _speed(lab, "04-peak-ratio", peak["ckpt"] / peak["plain"], "lower", **partner,
                        note=f"peak {mib['ckpt']:.0f} MiB vs {mib['plain']:.0f} MiB at batch {batch}")
    fits = grading.judge("04-fits-budget", peak["ckpt-2x"] / budget, machine, **partner,
                         note=(f"batch {2 * batch}: checkpointed {mib['ckpt-2x']:.0f} MiB, plain "
                               f"{mib['plain-2x']:.0f} MiB, budget {budget / 2**20:.0f} MiB"),
                         details={"budget_bytes": budget, **{f"peak_{k}": v for k, v in peak.items()}})

    # More rounds than a speedup check: the overhead is judged against a bar, not just reported.
    cmp = measure.compare(lambda: plain(small_x, small_y), lambda: ckpt(small_x, small_y), lab.device,
                          rounds=max(7, lab.profile.rounds), steps_per_round=lab.profile.steps_per_round)
    overhead = 1 / cmp.speedup.median - 1
    cost = _speed(lab, "04-time-overhead", overhead, "lower", **partner,
                  note=f"{cmp.summary()['candidate_ms']:.0f} ms vs {cmp.summary()['baseline_ms']:.0f} ms "
                              f"per step ({cmp.speedup.n} paired rounds, speedup IQR {cmp.speedup.q1:.2f}-"
                              f"{cmp.speedup.q3:.2f})")
    return [grad, act, peak_check, fits, cost]


def group_norm_resnet(seed: int = 0) -> torch.nn.Module:
    """ResNet-18 with GroupNorm in place of BatchNorm (Used by: 04's accumulation check).

    BatchNorm normalises with the statistics of the batch it sees, so k micro-batches are not the
    same computation as one large batch; a per-sample norm makes accumulation exactly equal.
    """
    import torchvision

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torchvision.models.resnet18(num_classes=10, norm_layer=lambda c: torch.nn.GroupNorm(8, c))


@_check("04-accum-match")
def accumulation(namespace, lab):
    """k micro-batches give the large batch's gradients and exactly one optimizer update."""
    step_fn = _student(namespace, "accumulate_step", "04")
    size = min(64, lab.profile.image_size)
    images, labels = _one_batch(lab, batch_size=2 * lab.profile.batch_size, image_size=size)
    images, labels = images.to(lab.device), labels.to(lab.device)
    reference, model = group_norm_resnet(lab.seed).to(lab.device), group_norm_resnet(lab.seed).to(lab.device)
    want, _ = _grads_and_stats(reference, reference, images, labels)
    lr = 0.1
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss = step_fn(model, optimizer, images, labels, 3)  # 3 does not divide the batch: uneven micro-batches
    got = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    why = _first_mismatch("gradients", got, want, rtol=1e-4, atol=1e-6)
    if not why:
        updated = [b - lr * g for b, g in zip(before, want)]
        why = _first_mismatch("weights after the update", [p.detach() for p in model.parameters()], updated,
                              rtol=1e-4, atol=1e-6)
        why = why and f"{why} (one optimizer.step() per large batch, after all micro-batches)"
    if not why and not torch.isfinite(torch.as_tensor(loss)).all():
        why = f"accumulate_step returned a non-finite loss {loss}"
    return [grading.judge("04-accum-match", float(not why), lab.machine.as_dict(), correct=not why,
                          why_incorrect=why, note="" if why else "gradients and the update match one large batch")]


# ---------------------------------------------------------------------------------------------
# 05_compile

def inference_setup(lab, batch_size: int | None = None):
    """A seeded ResNet-18 for inference, a batch, and the autocast context of this device (Used by: 05).

    Returns ``(model, images, autocast)``: the model in eval mode and channels_last, the batch on
    the device, and autocast to fp16 (GPU) or bf16 (a CPU with bf16 units): inference in 16 bits,
    where compiling pays on CPUs with bf16 units. A CPU without them infers in float32 (autocast
    off), since emulated bf16 is far slower there.
    """
    name = hardware.autocast_dtype(lab.machine)
    model = train.build_model(seed=lab.seed).to(lab.device).eval().to(memory_format=torch.channels_last)
    images, _ = _one_batch(lab, batch_size=batch_size)
    images = images.to(lab.device).contiguous(memory_format=torch.channels_last)
    return model, images, torch.autocast(lab.device.type, dtype=getattr(torch, name or "bfloat16"),
                                          enabled=name is not None)


def cold_compile_s(compiled, *args, device) -> float:
    """Seconds of the first call of a freshly compiled function, with the graph caches off.

    The caller runs ``torch.compiler.reset()`` first (Dynamo forgets what it compiled), and the
    FX graph and autotuning caches are off here, so tracing, lowering and autotuning all happen
    again. Inductor's on-disk cache of already-built C++/Triton kernels stays on (it cannot be
    switched off per call), so a repeated compile on one machine is faster than the very first
    one there: 05 reports both. Used by: 05 and its checks.
    """
    from torch._inductor import config as inductor_config

    with inductor_config.patch(fx_graph_cache=False, autotune_local_cache=False):
        return measure.one_off_s(lambda: compiled(*args), device)


@_check("05-compile-speedup", "05-break-even")
def compile_inference(namespace, lab):
    """The student's compiled inference matches eager, is faster where compile pays, and their
    break-even formula is right on the compile time measured now."""
    from torch._dynamo.utils import counters  # Dynamo's own count of the graphs it captured

    compile_fn = _student(namespace, "compile_inference", "05")
    break_even = _student(namespace, "break_even_steps", "05")
    machine = lab.machine.as_dict()
    model, images, autocast = inference_setup(lab)
    torch.compiler.reset()
    compiled = compile_fn(model)
    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad(), autocast:
        compile_s = cold_compile_s(compiled, images, device=lab.device)
        graphs = counters["stats"]["unique_graphs"] - graphs  # what Dynamo captured on the first call
        eager_out, compiled_out = model(images).float(), compiled(images).float()
        rel_err = float((compiled_out - eager_out).norm() / eager_out.norm())
        correct = rel_err <= 0.02
        why = f"compiled logits differ from eager by {rel_err:.1%} (relative L2; 2% allowed)"
        cmp = measure.compare(lambda: model(images), lambda: compiled(images), lab.device,
                              rounds=lab.profile.rounds, steps_per_round=4 * lab.profile.steps_per_round)
    summary = cmp.summary()
    speed = _speed(lab, "05-compile-speedup", cmp.speedup.median, correct=correct, why_incorrect=why,
                   optimised=graphs > 0, why_not_optimised="torch.compile captured no graph on the first call "
                   "of what compile_inference returned: it runs eagerly")
    speed = dataclasses.replace(speed, note=(speed.note + "; " if speed.note else "") +
                                f"{cmp}; outputs within {rel_err:.2%} of eager",
                                details={"compile_s": compile_s, "graphs": graphs, **summary})
    eager_ms, compiled_ms = summary["baseline_ms"], summary["candidate_ms"]
    cases = [(compile_s, eager_ms, compiled_ms), (20.0, 100.0, 60.0), (30.0, 50.0, 55.0)]
    wrong = []
    for c, e, k in cases:
        want = math.inf if k >= e else c * 1000 / (e - k)
        got = float(break_even(c, e, k))
        if not (got == want or (math.isfinite(want) and abs(got - want) <= 0.01 * want + 1)):
            wrong.append(f"break_even_steps({c:.1f}, {e:.1f}, {k:.1f}) = {got:.4g}, expected {want:.4g}")
    even = grading.judge("05-break-even", float(not wrong), machine, correct=not wrong,
                         why_incorrect="; ".join(wrong),
                         note=f"compile took {compile_s:.1f} s (measured now, graph caches off); "
                              f"pays after {cases[0][0] * 1000 / max(eager_ms - compiled_ms, 1e-9):.0f} steps"
                         if compiled_ms < eager_ms else f"compile took {compile_s:.1f} s and never pays here")
    return [speed, even]


# ---------------------------------------------------------------------------------------------
# 06_report

from . import report  # noqa: E402  (report imports results only; kept next to the checks using it)


@_check("06-stages")
def stages(namespace, lab):
    """Every rung of the ladder was recorded, on this machine."""
    lad = report.ladder(machine=lab.machine.as_dict())
    present = len(lad.table)
    return [grading.judge("06-stages", present, lab.machine.as_dict(),
                          note="; ".join(lad.missing) or f"all {present} stages recorded on this machine")]


def _crafted_results() -> pd.DataFrame:
    rows = [("01-baseline", 40.0, 300e6, None), ("02-data", 50.0, 300e6, None), ("03-amp", 80.0, 200e6, 0.93),
            ("04-memory", 84.0, 250e6, None), ("05-compile", 76.0, 210e6, None)]
    return pd.DataFrame([{"stage": s, "samples_per_s": t, "peak_bytes": p, "accuracy": a} for s, t, p, a in rows])


@_check("06-ladder-table")
def ladder_table(namespace, lab):
    """assemble_ladder builds the ladder from any results: this machine's, and a crafted set."""
    assemble = _student(namespace, "assemble_ladder", "06")
    cols = ["samples/s", "speedup (cumulative)", "speedup (this rung)", "peak MiB", "accuracy %"]
    wrong = []
    for name, frame in (("the crafted results", _crafted_results()), ("this machine's results", None)):
        if frame is None:
            try:
                frame = results.load_all()
            except results.ResultsError:
                continue
            if frame.empty:  # nothing recorded yet: 06-stages says which notebooks to run
                continue
        want = report.ladder_from_frame(frame)[cols]
        got = assemble(frame.copy())
        try:
            pd.testing.assert_frame_equal(got[cols].astype(float), want.astype(float), check_exact=False,
                                          rtol=1e-6, check_names=False)
        except (AssertionError, KeyError, TypeError, AttributeError) as err:
            wrong.append(f"on {name}: {str(err).splitlines()[0][:200]}")
    return [grading.judge("06-ladder-table", float(not wrong), lab.machine.as_dict(), correct=not wrong,
                          why_incorrect="; ".join(wrong))]


@_check("06-end-to-end")
def end_to_end(namespace, lab):
    """The fully optimised training, loader included, re-measured against the naive baseline now.

    Its partner is the student's ladder: it counts only once every rung was measured on this
    machine and ``assemble_ladder`` exists (an untouched notebook earns nothing here).
    """
    _student(namespace, "assemble_ladder", "06")(_crafted_results())  # must run: no free points
    lad = report.ladder(machine=lab.machine.as_dict())
    profile = lab.profile
    config = report.optimised_config(lab.machine)
    naive_step = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    fast_step = train.make_step(config, lab.device, seed=lab.seed)
    naive = train.pipeline_step(pipeline.forever(pipeline.naive_loader(profile, seed=lab.seed)), naive_step)
    batches = pipeline.forever(pipeline.FastLoader(profile, device=lab.device, seed=lab.seed, progress=False))
    fast = train.pipeline_step(batches, fast_step, non_blocking=True, item_every_step=False)
    # Partner: the same samples per step, and the optimised step really trains.
    x, y = fast_step.to_device(*next(batches))
    ok, why = grading.step_trains(fast_step, x, y, steps=2)
    if ok and lad.missing:
        ok, why = False, "the ladder is incomplete: " + "; ".join(lad.missing)
    if ok and x.shape[0] != profile.batch_size:
        ok, why = False, f"the optimised step sees {x.shape[0]} samples, the baseline {profile.batch_size}"
    cmp = measure.compare(naive, fast, lab.device, rounds=profile.rounds,
                          steps_per_round=profile.steps_per_round, warmup=max(1, profile.warmup_steps))
    result = _speed(lab, "06-end-to-end", cmp.speedup.median, correct=ok, why_incorrect=why)
    return [dataclasses.replace(result, note=(result.note + "; " if result.note else "") +
                                f"{cmp} ({config})", details=cmp.summary())]


@_check("06-html")
def html_report(namespace, lab):
    """The notebook exported the report: one HTML file, written now, with the ladder table and the plots."""
    _student(namespace, "assemble_ladder", "06")(_crafted_results())  # the student's table is in it
    path = report.default_path()
    if not path.is_file():
        raise StudentCodeError(f"{path} does not exist: run the export cell of 06 "
                               "(ls.report.export_html(ls.report.default_path())).")
    started = _process_start_s()
    if started is not None and path.stat().st_mtime < started - 1:
        raise StudentCodeError(f"{path} is older than this kernel: run the export cell again.")
    text = path.read_text(encoding="utf-8", errors="replace")
    found = {"ladder table": 'class="dataframe ladder"' in text,
             "embedded plots": text.count('src="data:image/png;base64,') >= 1,
             "machine": 'class="dataframe machine"' in text}
    missing = [k for k, v in found.items() if not v]
    return [grading.judge("06-html", float(not missing), lab.machine.as_dict(), correct=not missing,
                          why_incorrect=f"{path} lacks: {', '.join(missing)}")]
