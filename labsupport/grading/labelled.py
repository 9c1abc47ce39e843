"""01's ``labelled_step``, profiled where the step runs (:func:`.g01_worker.profile_labelled`), read
by the check: :func:`phases_holding_their_work` reads whether each phase's label holds the work it
names (:data:`~.g01_worker.PHASE_WORK`), on the model and batch handed over
(:func:`model_convolutions`). The checks are in :mod:`.g01_profile`.
"""

from __future__ import annotations

from collections import Counter

import torch

from .. import train
from .g01_worker import PHASE_WORK, PROFILE_RECORDED, PROFILE_SKIPPED, profile_labelled  # noqa: F401 (re-exported)


def model_convolutions(batch_size: int, image_size: int) -> dict[str, Counter]:
    """The convolutions one training step of the lab's network runs on a batch of ``batch_size``
    images of ``image_size`` px, as :func:`.g01_worker._named` names them: ``{"forward": Counter of
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
