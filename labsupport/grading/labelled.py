"""01's ``labelled_step``, profiled by the check: what each call ran, and where its labels are.

:func:`profile_labelled` calls the student's step as 01's profiler cell does (two calls, then two
recorded, with input shapes) and keeps what the checks read: the labels and the operators that
name work (a convolution's with its input and weight shapes), and per call the batches drawn, the
step's own convolution layers run (by identity) and its parameters left unchanged.
:func:`phases_holding_their_work` reads whether each phase's label holds the work it names, on the
model and batch handed over (:func:`model_convolutions`). The checks are in :mod:`.g01_profile`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch

from .. import measure, pipeline, train
from .watch import watched


# The profile the check takes, as 01's profiler cell does with torch.profiler.schedule(wait=1,
# warmup=1, active=2): two calls not recorded, then two recorded, each its own ProfilerStep.
PROFILE_SKIPPED, PROFILE_RECORDED = 2, 2
# The operators whose input shapes tie a profile to the model and batch it was given (record_shapes):
# a convolution's input and weight; for its backward, aten's (grad_output, input, weight, ...).
SHAPED = {"aten::conv2d": (0, 1), "aten::convolution_backward": (1, 2)}


def _named(event) -> str:
    """An event's name as the checks read it: a convolution's with its input and weight shapes
    (``aten::conv2d [32, 3, 112, 112] [64, 3, 7, 7]``), cut to 120 characters."""
    name = str(event.name)
    if name in SHAPED:
        shapes = list(getattr(event, "input_shapes", None) or [])
        name += "".join(f" {list(shapes[i]) if i < len(shapes) else []}" for i in SHAPED[name])
    return name[:120]


def profile_labelled(fn: Callable, lab) -> dict:
    """``fn(batches, step)`` (the student's ``labelled_step``) called PROFILE_SKIPPED times, then
    PROFILE_RECORDED times under the profiler (:func:`measure.profiler`, with input shapes), each
    call a ``ProfilerStep#N`` as torch.profiler's schedule labels it, given the naive loader's
    batches and a fresh fp32 step of the lab's: ``{"events": [(name, is a record_function label,
    start µs, end µs)] of the recorded steps (:func:`_named`), "drawn": batches each call took,
    "ran": how many of the step's own Conv2d layers ran forward in each call, "unchanged": how many
    of its parameters each call left as they were, "parameters": how many it has}``."""
    step = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    source = pipeline.forever(pipeline.naive_loader(lab.profile, seed=lab.seed))
    taken, ran = [0], set()

    def batches():
        for batch in source:
            taken[0] += 1
            yield batch

    # The step's own layers, by identity: a deep copy of the model carries these hooks along, and
    # its layers, which are not these, count nothing.
    # (A function is copied by reference, its closure with it; a functools.partial would be deep-copied.)
    hooks = [_ran_hook(layer, ran) for layer in step.model.modules() if isinstance(layer, torch.nn.Conv2d)]
    fn = watched(fn, "labelled_step", "01", given=hooks[:1])  # the hooks are the check's, beneath the student's forward
    feed, parameters = batches(), list(step.model.parameters())
    drawn, layers_ran, unchanged = [], [], []

    def call():
        was, before = taken[0], [p.detach().clone() for p in parameters]
        ran.clear()
        fn(feed, step)
        measure.sync(lab.device)
        drawn.append(taken[0] - was)
        layers_ran.append(len(ran))
        unchanged.append(sum(torch.equal(a, p.detach()) for a, p in zip(before, parameters)))

    for _ in range(PROFILE_SKIPPED):
        call()
    with measure.profiler(lab.device, shapes=True) as prof:
        for i in range(PROFILE_RECORDED):
            with torch.profiler.record_function(f"ProfilerStep#{PROFILE_SKIPPED + i}"):
                call()
    # What the checks read, and no more: the host's operators and labels (not the GPU's kernels,
    # whose long names would crowd the judge's wire), labels and the operators that name work.
    keys = ("conv",) + tuple(k for work in PHASE_WORK.values() for k in work)
    events = [(_named(e), bool(e.is_user_annotation), float(e.time_range.start), float(e.time_range.end))
              for e in prof.function_events if e.device_type == torch.autograd.DeviceType.CPU
              and (e.is_user_annotation or any(k in str(e.name).lower() for k in keys))]
    return {"events": events, "drawn": drawn, "ran": layers_ran, "unchanged": unchanged,
            "parameters": len(parameters)}


def _ran_hook(layer: torch.nn.Module, ran: set):
    """A forward hook on ``layer`` that adds its id to ``ran`` when ``layer`` itself runs forward."""
    def hook(module, args, out):
        if module is layer:
            ran.add(id(layer))
    layer.register_forward_hook(hook)
    return hook


def model_convolutions(batch_size: int, image_size: int) -> dict[str, Counter]:
    """The convolutions one training step of the lab's network runs on a batch of ``batch_size``
    images of ``image_size`` px, as :func:`_named` names them: ``{"forward": Counter of
    "aten::conv2d <input shape> <weight shape>", "backward": the same for
    "aten::convolution_backward"}`` (ResNet-18: 20 of each), traced on the meta device (no data)."""
    with torch.device("meta"):
        model = train.build_model()
    seen = Counter()
    for layer in (m for m in model.modules() if isinstance(m, torch.nn.Conv2d)):
        layer.register_forward_hook(lambda m, args, out: seen.update([f"{list(args[0].shape)} {list(m.weight.shape)}"]))
    with torch.no_grad():
        model(torch.empty(batch_size, 3, image_size, image_size, device="meta"))
    return {phase: Counter({f"{op} {sig}"[:120]: n for sig, n in seen.items()})
            for phase, op in (("forward", "aten::conv2d"), ("backward", "aten::convolution_backward"))}


# What a labelled phase must hold (operators or labels starting inside it, by name, lower-cased):
# the work it names. The forward and the backward hold the network's convolutions on the batch
# handed over (each convolution's input and weight shapes, as many as the network runs), and no
# convolution of theirs runs elsewhere in the step: a label around one token convolution, or
# around a small other network, or a forward whose result is thrown away while the step runs
# outside the labels, does not hold the step's. "data wait" and "host to device" may hold nothing
# (on a CPU the copy is nothing).
PHASE_WORK = {"forward": ("aten::conv2d",), "backward": ("aten::convolution_backward",),
              "optimizer": ("optimizer.step#", "_foreach_", "aten::add_", "aten::mul_", "aten::addcmul_",
                            "aten::lerp_")}
PHASE_HOLDS_THE_CONVOLUTIONS = ("forward", "backward")


def phases_holding_their_work(events: list[tuple[str, bool, float, float]],
                              expected: dict[str, Counter] | None = None) -> tuple[int, str]:
    """``(phases, why)``: how many of train.PHASES one profiled step labels with record_function,
    in order, each around the work it names (PHASE_WORK; the forward and the backward every
    convolution of ``expected``, by its shapes (:func:`model_convolutions`; None: any one), and none
    of theirs outside them), in the step that does best; ``why`` says what is missing there ("" when
    all five are). ``events`` are ``(name, is a label, start, end)``; a step is a ``ProfilerStep``
    label (the whole profile where there is none); the first label of each phase in it counts."""
    import bisect

    work = sorted((start, name.lower()) for name, label, start, _ in events if not label or name.startswith("Optimizer."))
    starts = [w[0] for w in work]
    steps = [(start, end) for name, label, start, end in events if label and name.startswith("ProfilerStep")]
    steps = steps or [(-float("inf"), float("inf"))]
    labels = sorted((start, end, name) for name, label, start, end in events if label and name in train.PHASES)

    def inside(start: float, end: float) -> list[str]:
        return [name for _, name in work[bisect.bisect_left(starts, start):bisect.bisect_right(starts, end)]]

    def holds(phase: str, start: float, end: float, lo: float, hi: float) -> bool:
        if phase not in PHASE_HOLDS_THE_CONVOLUTIONS:
            return any(any(k in name for k in PHASE_WORK[phase]) for name in inside(start, end))
        op = PHASE_WORK[phase][0]
        mine = [name for name in inside(start, end) if name.split(" ")[0] == op]
        outside = [name for name in inside(lo, hi) if name.split(" ")[0] == op]
        want = (expected or {}).get(phase) or Counter({op: 1})
        got = Counter(mine) if expected else Counter(name.split(" ")[0] for name in mine)
        return all(got[k] >= n for k, n in want.items()) and len(outside) == len(mine)

    layers = sum((expected or {}).get("forward", Counter()).values())
    best = (-1, "")
    for lo, hi in steps:
        first = {}
        for start, end, name in labels:
            if lo <= start <= hi and name not in first:
                first[name] = (start, end)
        missing = [p for p in train.PHASES if p not in first]
        empty = [p for p, (start, end) in first.items() if p in PHASE_WORK and not holds(p, start, end, lo, hi)]
        order = [p for p in train.PHASES if p in first]
        ordered = all(first[a][1] <= first[b][0] for a, b in zip(order, order[1:]))
        good = 0 if not ordered else len(first) - len(empty)
        why = "; ".join(filter(None, [
            missing and f"no record_function label for {', '.join(map(repr, missing))} in the profile; label each "
                        "phase of the step with ls.train.PHASES' names",
            empty and f"{', '.join(map(repr, empty))} wrap{'s' if len(empty) == 1 else ''} not the work "
                      f"{'it names' if len(empty) == 1 else 'they name'} (the forward all the "
                      f"{layers or 'network' + chr(39) + 's'} convolutions of the step's model on the batch it "
                      "was given, the backward their convolution_backward, none of them outside their label; "
                      "the optimizer its update): put the step's own code inside the labels",
            not ordered and f"the labels are not in the step's order ({', '.join(sorted(first, key=first.get))}, "
                            "by start time, overlapping"
                            " or not one after the other): label one step as it runs"]))
        best = max(best, (good, why), key=lambda b: b[0])
    return best
