"""Graded checks of 07_compression: the student's pruning and int8 quantisation, measured now.

Both start from an fp32 ResNet-18 the check trains itself (:func:`labsupport.compress.train_fp32`),
and run on the CPU.

- ``07-sparsity``: ``prune_globally(model, 0.5)``, the lab's fine-tune, then ``make_permanent``
  leave half of the Conv2d and Linear weights zero *in the weights* (no masks left), and those
  zeros are the weights that were smallest in magnitude across the whole network.
- ``07-pruned-accuracy``: that model's validation accuracy is within the stated gap of fp32's.
- ``07-int8-size``: ``quantize_int8`` returns a model whose weights are int8 and whose
  tensors take at most the stated share of fp32's bytes, with logits close to fp32's.
- ``07-int8-speedup``: compiled the lab's way (:func:`labsupport.compress.compiled`), as the fp32
  model is, it is faster than fp32 per request of 32 images, paired.
- ``07-int8-accuracy``: its validation accuracy is within the stated gap of fp32's.

Accuracy needs a trained model, so on a profile that grades no speed (tests) the accuracy and
speed checks say n/a once the student's code ran and passed its partners.

Each check is written once, against ``sides``: :class:`Here` calls the student's functions in this
process (the notebook's self-check); the grader's judge passes its :class:`Remote`, which
calls them in the student's worker. Either way the fp32 model is trained where the check runs
and handed over as weights; what comes back is weights (pruning) and an exported model as data
(quantisation, :mod:`.exported`), and every figure is counted and measured where the check runs.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from .. import compress, measure
from . import CheckResult, StudentCodeError, exported, judge, lab_bar, register, speed, student
from .g07_worker import Case, Here, Pruned, _data  # noqa: F401 (re-exported)
from .judge_setup import Judged, MODEL_BYTES, RemoteSides

_TRAINED: dict[tuple, tuple] = {}  # (profile, seed, device) -> (data, fp32 model, its accuracy)
MAX_LOGIT_ERROR = 0.10  # int8 logits vs fp32's, relative L2 on one serving batch (trained: about 0.01)
TIE = 1e-12  # magnitudes this close count as tied at the pruning threshold


def trained(lab) -> tuple[compress.Data, torch.nn.Module, float]:
    """The data, the fp32 model trained on this machine now, and its accuracy (once per process)."""
    key = (lab.profile, lab.seed, str(lab.device))
    if key not in _TRAINED:
        with compress.quiet():
            data = _data()
            model = compress.train_fp32(lab, data, progress=False)
            _TRAINED[key] = data, model, compress.accuracy(model, data.val_images, data.val_labels)
    data, model, acc = _TRAINED[key]
    return data, copy.deepcopy(model), acc


def _gap_check(check: str, lab, fp32_acc: float, acc: float, *, correct: bool, why: str, what: str) -> CheckResult:
    gap = 100 * (fp32_acc - acc)
    note = f"fp32 {100 * fp32_acc:.1f}%, {what} {100 * acc:.1f}% on {compress.IMAGE_SIZE} px validation images"
    details = {"accuracy_fp32": fp32_acc, "accuracy": acc}
    if correct and not lab_bar(check, lab).applies:
        return judge(check, None, lab, note="your code ran", details=details)
    return judge(check, gap, lab, correct=correct, why_incorrect=why, note=note,
                 details=details)


def _pruning_errors(model: torch.nn.Module, before: list[torch.Tensor], amount: float) -> tuple[float, list[str]]:
    """``(sparsity, what is wrong)`` of the check's own copy of the network holding the weights a
    pruning left (masks and hooks are :func:`_judged_pruning`'s to find).

    ``before`` holds each prunable layer's weight when ``prune_globally`` was called.
    """
    found = compress.sparsity(model)
    wrong = []
    if found.fraction > amount + 0.005:
        wrong.append(f"{found.fraction:.1%} of the weights are zero, more than the {amount:.0%} asked for")
    if found.fraction >= amount - 0.005 and not wrong:
        weights = [m.weight.detach() for _, m in compress.prunable(model)]
        zero = torch.cat([(w == 0).flatten() for w in weights])
        magnitude = torch.cat([b.abs().flatten() for b in before])
        if zero.all() or not zero.any():
            return found.fraction, wrong
        largest_pruned, smallest_kept = float(magnitude[zero].max()), float(magnitude[~zero].min())
        if largest_pruned > smallest_kept + TIE:
            wrong.append(f"a weight of magnitude {largest_pruned:.3g} was zeroed while one of "
                         f"{smallest_kept:.3g} was kept: prune the smallest weights of the whole "
                         "network (global_unstructured with L1Unstructured), not layer by layer")
    return found.fraction, wrong


def _judged_pruning(fp32: torch.nn.Module, got: Pruned) -> tuple[torch.nn.Module, list[str]]:
    """A copy of ``fp32`` holding the pruned weights that came back, and what is wrong with them."""
    wrong = []
    masks = sorted({name.rsplit(".", 1)[0] for name in got.names if name.endswith(("weight_orig", "weight_mask"))})
    if masks:
        wrong.append(f"{len(masks)} layers still hold weight_orig and weight_mask (first: {masks[0]}): "
                     "make_permanent must fold each mask into its weight with prune.remove(module, 'weight')")
    elif got.hooks:
        wrong.append(f"{got.hooks} layers still run forward pre-hooks")
    model = copy.deepcopy(fp32)
    missing = sorted(set(model.state_dict()) - set(got.state))
    if missing:
        raise StudentCodeError(f"the pruned model has no {missing[0]}: prune_globally and make_permanent must "
                               "return the ResNet-18 they were given")
    try:
        model.load_state_dict(got.state)
    except RuntimeError as err:
        raise StudentCodeError(f"the pruned model's weights do not fit a ResNet-18: {str(err)[:300]}") from None
    return model, wrong


@register("07-sparsity", "07-pruned-accuracy")
def pruning(namespace, lab, sides=None):
    """Half the weights really zero, the globally smallest, and accuracy within reach of fp32's:
    counted and measured here, on a copy of fp32's model holding the weights the student's pruning
    returned (in the grader: sent back by their worker)."""
    student(namespace, "prune_globally", "07")
    student(namespace, "make_permanent", "07")
    data, fp32, fp32_acc = trained(lab)
    before = [m.weight.detach().clone() for _, m in compress.prunable(fp32)]
    got = (sides or Here(namespace, lab)).pruned(fp32.state_dict())
    final, wrong = _judged_pruning(fp32, got)
    fraction, more = _pruning_errors(final, before, compress.AMOUNT)
    wrong += more
    total = compress.sparsity(final).total
    if fraction < compress.AMOUNT - 0.005 and got.masked >= compress.AMOUNT - 0.005 and not got.masks_through_tune:
        wrong.append(f"{got.masked:.0%} of the weights were zero after prune_globally, "
                     f"{fraction:.1%} after the fine-tune: the masks were removed before it, so the "
                     "zeroed weights were trained back. Keep them until make_permanent")
    with compress.quiet():
        acc = compress.accuracy(final, data.val_images, data.val_labels)
    why = "; ".join(wrong)
    sparse = judge("07-sparsity", fraction, lab, correct=not wrong, why_incorrect=why,
                   note=f"{fraction:.2%} of {total / 1e6:.1f} M Conv2d and Linear weights are zero, "
                        f"counted in the weights after the fine-tune and make_permanent",
                   details={"sparsity": fraction, "weights": total})
    accurate = _gap_check("07-pruned-accuracy", lab, fp32_acc, acc, correct=sparse.status == "pass",
                          why=f"the model is not pruned as asked ({sparse.note})", what="pruned")
    return [sparse, accurate]


def _quantiser_versions() -> str:
    """The torch and torchao this ran with. With torch 2.11.0 and torchao 0.18.0 (an H200's image,
    2026-11-26) a non-strict ``torch.export`` left out each operator's ``source_fn_stack``, the x86
    quantiser annotated nothing and ``convert_pt2e`` returned a float32 model; strict export fixed
    it (torch 2.14 annotates either way)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ao = version("torchao")
    except PackageNotFoundError:
        ao = "not installed"
    return f"torch {torch.__version__}, torchao {ao}"


@register("07-int8-size", "07-int8-speedup", "07-int8-accuracy")
def int8(namespace, lab, sides=None):
    """int8 weights in a model a quarter of fp32's size, close to its outputs, faster and as accurate.

    Every figure is of the model rebuilt here from the export of what ``quantize_int8`` returned
    (:mod:`.exported`): what it computes with, its logits, its accuracy, and its speed, both
    models compiled the lab's way (:func:`labsupport.compress.compiled`)."""
    student(namespace, "quantize_int8", "07")
    data, fp32, fp32_acc = trained(lab)
    batch = data.serving_batch()
    described = (sides or Here(namespace, lab)).quantized(fp32.state_dict())
    try:
        q = exported.rebuild(described)
    except exported.NotAModel as err:
        raise StudentCodeError(str(err)) from None
    with compress.quiet(), torch.no_grad():
        want, got = fp32(batch), q(batch)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        raise StudentCodeError(f"your int8 model returned {getattr(got, 'shape', type(got).__name__)} for a batch, "
                               f"not logits of shape {tuple(want.shape)}")
    got = got.float()
    weights = compress.sparsity(fp32).total
    # What each model computes with (the weights its operators read in a forward), not what it holds.
    mine, theirs = compress.computed_with(q, batch), compress.computed_with(fp32, batch)
    int8_bytes, fp32_bytes = mine.bytes, theirs.bytes
    ratio = int8_bytes / max(fp32_bytes, 1)
    error = float((got - want).norm() / want.norm())
    wrong = []
    int8_share = mine.int8_elements / weights
    if int8_share < 0.95:
        wrong.append(f"its forward reads only {int8_share:.0%} as many int8 elements as there are Conv2d and "
                     "Linear weights: the model does not compute with int8 weights (convert_pt2e makes one "
                     "that does where the quantiser found its patterns: export with strict=True, or the "
                     f"quantiser may find none; {_quantiser_versions()})")
    if not error <= MAX_LOGIT_ERROR:
        wrong.append(f"logits differ from fp32's by {error:.1%} (relative L2; {MAX_LOGIT_ERROR:.0%} allowed)")
    correct, why = not wrong, "; ".join(wrong)
    small = judge("07-int8-size", ratio, lab, correct=correct, why_incorrect=why,
                  note=f"{int8_bytes / 2**20:.1f} MiB vs {fp32_bytes / 2**20:.1f} MiB "
                       f"in fp32; logits within {error:.2%} of fp32's",
                  details={"bytes_ratio": ratio, "logit_error": error})
    if correct and lab_bar("07-int8-speedup", lab).applies:
        torch.compiler.reset()
        with compress.serving():  # no_grad and Inductor's freezing (int8 kernels need it)
            fast_fp32, fast_int8 = compress.compiled(fp32), compress.compiled(q)
            fast_fp32(batch), fast_int8(batch)  # the compiles, outside the timing
            cmp = measure.compare(lambda: fast_fp32(batch), lambda: fast_int8(batch), compress.CPU,
                                  rounds=lab.profile.rounds, steps_per_round=4 * lab.profile.steps_per_round)
        fast = speed(lab, "07-int8-speedup", cmp.speedup.median)
        fast = dataclasses.replace(fast, note=(fast.note + "; " if fast.note else "") +
                                   f"{cmp}; both compiled the lab's way (torch.compile, freezing on), "
                                   f"batches of {len(batch)}",
                                   details=cmp.summary())
    else:
        fast = speed(lab, "07-int8-speedup", None, correct=correct, why_incorrect=why,
                     note="the int8 model runs")
    with compress.quiet():
        acc = compress.accuracy(q, data.val_images, data.val_labels) if correct else 0.0
    accurate = _gap_check("07-int8-accuracy", lab, fp32_acc, acc, correct=correct, why=why, what="int8")
    return [small, fast, accurate]


def distillation_reference(student_logits, teacher_logits, labels, alpha: float, temperature: float, *,
                           soft_scale: float | None = None, reverse: bool = False, task_only: bool = False):
    """What the check compares with: ``alpha * CE + (1 - alpha) * T^2 * KL(teacher || student)`` at
    temperature T, the KL averaged over the batch. The keywords make the usual mistakes, which the
    check names when a student's loss matches one: another scale of the soft term, the KL the wrong
    way round, the teacher left out (the task loss alone)."""
    import torch.nn.functional as F

    if task_only:
        return F.cross_entropy(student_logits, labels)
    mine, theirs = F.log_softmax(student_logits / temperature, 1), F.log_softmax(teacher_logits / temperature, 1)
    if reverse:
        mine, theirs = theirs, mine
    kl = (theirs.exp() * (theirs - mine)).sum(1).mean()  # KL(teacher || student), per image
    scale = temperature ** 2 if soft_scale is None else soft_scale
    return alpha * F.cross_entropy(student_logits, labels) + (1 - alpha) * scale * kl


MISTAKES = {  # what a loss that matches one of these instead is told, and the keywords that make it
    "the soft term is not multiplied by T^2 (its gradients shrink as 1/T^2)": lambda case: {"soft_scale": 1.0},
    "the soft term is multiplied by T, not T^2": lambda case: {"soft_scale": case.temperature},
    "the KL divergence is the wrong way round: KL(teacher || student) is the soft term": lambda case: {"reverse": True},
    "the teacher is left out: only the task loss is there": lambda case: {"task_only": True},
}
MAX_LOSS_ERROR = 1e-3  # relative, on the loss and on its gradient (float32 against float64: about 1e-6)


def distill_cases(seed: int = 0) -> list[Case]:
    """Crafted logits: seeded, 16 images of 10 classes, at several weights and temperatures, one
    case with large logits (a loss that does not compute in log space overflows there)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for alpha, temperature, scale in ((0.5, 4.0, 3.0), (0.1, 2.0, 3.0), (0.9, 1.0, 3.0), (0.0, 8.0, 3.0),
                                      (1.0, 4.0, 3.0), (0.5, 1.0, 100.0)):
        out.append(Case(scale * torch.randn(16, 10, generator=g), scale * torch.randn(16, 10, generator=g),
                        torch.randint(0, 10, (16,), generator=g), alpha, temperature))
    return out


def _distill_errors(cases: list[Case], got: list[tuple[float, torch.Tensor]]) -> tuple[float, str]:
    """The largest relative error of the student's losses and gradients against the reference's,
    and what is wrong (empty when within :data:`MAX_LOSS_ERROR`)."""
    def against(case, **kw) -> tuple[float, torch.Tensor]:
        logits = case.student.double().requires_grad_(True)
        value = distillation_reference(logits, case.teacher.double(), case.labels, case.alpha, case.temperature, **kw)
        value.backward()
        return float(value.detach()), logits.grad

    def error(mine, want) -> float:
        (value, grad), (v, g) = mine, want
        if grad.shape != g.shape or not torch.isfinite(grad).all() or value != value:
            return float("inf")
        return max(abs(value - v) / max(abs(v), 1e-6), float((grad.double() - g).abs().max() / g.abs().max().clamp_min(1e-12)))

    if len(got) != len(cases):
        return float("inf"), f"{len(got)} answers to {len(cases)} cases"
    worst, where = 0.0, None
    for case, mine in zip(cases, got):
        e = error(mine, against(case))
        if e > worst:
            worst, where = e, (case, mine)
    if worst <= MAX_LOSS_ERROR:
        return worst, ""
    case, mine = where
    why = (f"with alpha {case.alpha} and T {case.temperature} your loss is {mine[0]:.6g}, the distillation "
           f"loss {against(case)[0]:.6g}")
    for mistake, made in MISTAKES.items():
        if all(error(m, against(c, **made(c))) <= MAX_LOSS_ERROR for c, m in zip(cases, got)):
            return worst, f"{why}: {mistake}"
    return worst, why + " (or its gradient differs)"


@register("07-distill-loss", "07-distill-accuracy")
def distillation(namespace, lab, sides=None):
    """The student's ``distillation_loss`` exact on crafted logits (value and gradient), and, where
    the profile grades accuracy, the small network distilled with it beating the same network
    trained alone.

    In the grader the loss runs in the student's worker on the crafted cases, and the judge trains
    the distilled network itself with :func:`distillation_reference`, which the student's loss
    has just been shown to compute (the training never calls student code, so a loss cannot act
    differently there)."""
    student(namespace, "distillation_loss", "07")
    cases = distill_cases(lab.seed)
    worst, why = _distill_errors(cases, (sides or Here(namespace, lab)).distill_losses(cases))
    loss = judge("07-distill-loss", worst, lab, correct=not why, why_incorrect=why,
                 note=f"largest relative error {worst:.2g} over {len(cases)} crafted cases (loss and gradient)",
                 details={"relative_error": worst})
    correct = loss.status == "pass"
    if correct and not lab_bar("07-distill-accuracy", lab).applies:
        return [loss, judge("07-distill-accuracy", None, lab, note="your loss is exact")]
    if not correct:
        return [loss, judge("07-distill-accuracy", None, lab, correct=False,
                            why_incorrect=f"distillation_loss is not the distillation loss ({why or loss.note})")]
    data, teacher, _ = trained(lab)
    alone, distilled = [], []
    with compress.quiet():
        for seed in compress.DISTILL_SEEDS:
            alone.append(compress.accuracy(compress.train_small(lab, data, seed=seed), data.val_images, data.val_labels))
            small = (sides or Here(namespace, lab)).distilled(lab, data, teacher, seed)
            distilled.append(compress.accuracy(small, data.val_images, data.val_labels))
    gap = 100 * (sum(distilled) - sum(alone)) / len(alone)
    accurate = judge("07-distill-accuracy", gap, lab,
                     note=f"distilled {', '.join(f'{100 * a:.1f}%' for a in distilled)} against alone "
                          f"{', '.join(f'{100 * a:.1f}%' for a in alone)} (seeds {list(compress.DISTILL_SEEDS)}, "
                          f"{compress.DISTILL_STEPS} steps, alpha {compress.DISTILL_ALPHA}, T {compress.DISTILL_TEMPERATURE})",
                     details={"distilled": distilled, "alone": alone})
    return [loss, accurate]


class Remote(RemoteSides):
    """07's judge side: the student's functions called in their worker (:class:`~.g07_worker.Side`)
    on the fp32 weights the judge trained; what comes back is checked and rebuilt here."""

    def _weights(self, method: str, weights: dict) -> dict:
        names = list(weights)
        return self.sides.ask("candidate", method, send=[weights[n] for n in names], names=names, slow=True)

    def pruned(self, weights: dict) -> Pruned:
        """The student's pruning on ``weights``; the weights it left come back as plain tensors."""
        reply = self._weights("pruned", weights)
        value, tensors = reply.get("value"), reply.get("tensors") or []
        names = value.get("names") if isinstance(value, dict) else None
        if not isinstance(names, list) or len(names) != len(tensors) or not isinstance(value.get("all"), list):
            raise StudentCodeError("the pruned model's weights did not come back")
        try:
            return Pruned(dict(zip((str(n) for n in names), tensors)), [str(n) for n in value["all"]],
                          float(value["masked"]), bool(value["masks_through_tune"]), int(value["hooks"]))
        except (KeyError, TypeError, ValueError):
            raise StudentCodeError("the pruned model's record did not come back") from None

    def quantized(self, weights: dict) -> exported.Described:
        """The student's ``quantize_int8`` on ``weights``, exported in their worker; its description
        comes back as data, rebuilt by the check."""
        try:
            return exported.Described.decoded(self._weights("quantized", weights).get("tensors") or [])
        except exported.NotAModel as err:
            raise StudentCodeError(str(err)) from None

    def distill_losses(self, cases: list[Case]) -> list[tuple[float, torch.Tensor]]:
        """The student's ``distillation_loss`` on each crafted case: each value, and its gradient
        with respect to the student's logits."""
        sent = [torch.stack([c.student for c in cases]), torch.stack([c.teacher for c in cases]),
                torch.stack([c.labels for c in cases])]
        reply = self.sides.ask("candidate", "distill_losses", send=sent, alphas=[c.alpha for c in cases],
                               temperatures=[c.temperature for c in cases])
        value, grads = reply.get("value"), reply.get("tensors") or []
        values = value.get("values") if isinstance(value, dict) else None
        if not isinstance(values, list) or len(values) != len(cases) or len(grads) != 1 \
                or grads[0].shape != sent[0].shape or not all(isinstance(v, (int, float)) for v in values):
            raise StudentCodeError("distillation_loss's values and gradients did not come back")
        return [(float(v), g) for v, g in zip(values, grads[0])]

    def distilled(self, lab, data, teacher, seed: int):
        """The small network distilled from ``teacher``, trained here with the loss the student's
        ``distillation_loss`` was just shown to compute: no student code runs in a training the
        judge then evaluates."""
        return compress.train_small(lab, data, seed=seed, teacher=teacher, loss=distillation_reference)


# How the judge sets up 07's checks: no baseline worker (the judge trains and compiles the fp32
# model itself); a model's state crosses.
JUDGED = Judged(buffer_floor=MODEL_BYTES + 2**20, remote=Remote)
