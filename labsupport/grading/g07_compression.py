"""Graded checks of 07_compression: the student's pruning and int8 quantisation, measured now.

Both start from an fp32 ResNet-18 the check trains itself (:func:`labsupport.compress.train_fp32`),
and run on the CPU.

- ``07-sparsity``: ``prune_globally(model, 0.5)``, the lab's fine-tune, then ``make_permanent``
  leave half of the Conv2d and Linear weights zero *in the weights* (no masks left), and those
  zeros are the weights that were smallest in magnitude across the whole network.
- ``07-pruned-accuracy``: that model's validation accuracy is within the stated gap of fp32's.
- ``07-int8-size``: ``quantize_int8`` returns a model whose weights are int8 and whose
  tensors take at most the stated share of fp32's bytes, with logits close to fp32's.
- ``07-int8-speedup``: compiled with the student's own 05 ``compile_inference`` (carried
  forward), as the fp32 model is, it is faster than fp32 per request of 32 images, paired.
- ``07-int8-accuracy``: its validation accuracy is within the stated gap of fp32's.

Accuracy needs a trained model, so on a profile that grades no speed (tests) the accuracy and
speed checks say n/a once the student's code ran and passed its partners.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from .. import compress, measure
from . import CheckResult, StudentCodeError, carried, judge, register, speed, student

_TRAINED: dict[tuple, tuple] = {}  # (profile, seed, device) -> (data, fp32 model, its accuracy)
MAX_LOGIT_ERROR = 0.10  # int8 logits vs fp32's, relative L2 on one serving batch (trained: about 0.01)
TIE = 1e-12  # magnitudes this close count as tied at the pruning threshold


def trained(lab) -> tuple[compress.Data, torch.nn.Module, float]:
    """The data, the fp32 model trained on this machine now, and its accuracy (once per process)."""
    key = (lab.profile, lab.seed, str(lab.device))
    if key not in _TRAINED:
        with compress.quiet():
            data = compress.load_data(progress=False)
            model = compress.train_fp32(lab, data, progress=False)
            _TRAINED[key] = data, model, compress.accuracy(model, data.val_images, data.val_labels)
    data, model, acc = _TRAINED[key]
    return data, copy.deepcopy(model), acc


def _gap_check(check: str, lab, fp32_acc: float, acc: float, *, correct: bool, why: str, what: str) -> CheckResult:
    gap = 100 * (fp32_acc - acc)
    note = f"fp32 {100 * fp32_acc:.1f}%, {what} {100 * acc:.1f}% on {compress.IMAGE_SIZE} px validation images"
    details = {"accuracy_fp32": fp32_acc, "accuracy": acc}
    if not lab.profile.grades_speed and correct:
        return CheckResult(check, None, None, "lower", lab.machine.device_class, "n/a",
                           f"profile {lab.profile.name} trains too briefly to compare accuracy; your code ran",
                           details)
    return judge(check, gap, lab.machine.as_dict(), correct=correct, why_incorrect=why, note=note,
                 details=details)


def _pruning_errors(model: torch.nn.Module, before: list[torch.Tensor], amount: float) -> tuple[float, list[str]]:
    """``(sparsity, what is wrong)`` of a pruned, fine-tuned and permanent ``model``.

    ``before`` holds each prunable layer's weight when ``prune_globally`` was called.
    """
    found = compress.sparsity(model)
    wrong = []
    if found.masks_left:
        wrong.append(f"{len(found.masks_left)} layers still hold weight_orig and weight_mask (first: "
                     f"{found.masks_left[0]}): make_permanent must fold each mask into its weight "
                     "with prune.remove(module, 'weight')")
    hooks = [name for name, m in compress.prunable(model) if m._forward_pre_hooks]
    if hooks and not found.masks_left:
        wrong.append(f"{len(hooks)} layers still run forward pre-hooks (first: {hooks[0]})")
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


@register("07-sparsity", "07-pruned-accuracy")
def pruning(namespace, lab):
    """Half the weights really zero, the globally smallest, and accuracy within reach of fp32's."""
    prune_globally = student(namespace, "prune_globally", "07")
    make_permanent = student(namespace, "make_permanent", "07")
    data, fp32, fp32_acc = trained(lab)
    model = copy.deepcopy(fp32)
    before = [m.weight.detach().clone() for _, m in compress.prunable(model)]
    with compress.quiet():
        pruned = prune_globally(model, compress.AMOUNT)
        if not isinstance(pruned, torch.nn.Module):
            raise StudentCodeError(f"prune_globally must return the model, not {type(pruned).__name__}")
        masked = sum(int((m.weight == 0).sum()) for _, m in compress.prunable(pruned))
        tuned = compress.fine_tune(pruned, lab, data, progress=False)
        final = make_permanent(tuned)
        if not isinstance(final, torch.nn.Module):
            raise StudentCodeError(f"make_permanent must return the model, not {type(final).__name__}")
        fraction, wrong = _pruning_errors(final, before, compress.AMOUNT)
        total = compress.sparsity(final).total
        if fraction < compress.AMOUNT - 0.005 and masked >= (compress.AMOUNT - 0.005) * total \
                and not compress.sparsity(tuned).masks_left:
            wrong.append(f"{masked / total:.0%} of the weights were zero after prune_globally, "
                         f"{fraction:.1%} after the fine-tune: the masks were removed before it, so the "
                         "zeroed weights were trained back. Keep them until make_permanent")
        acc = compress.accuracy(final, data.val_images, data.val_labels)
    why = "; ".join(wrong)
    sparse = judge("07-sparsity", fraction, lab.machine.as_dict(), correct=not wrong, why_incorrect=why,
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
def int8(namespace, lab):
    """int8 weights in a model a quarter of fp32's size, close to its outputs, faster and as accurate."""
    quantize = student(namespace, "quantize_int8", "07")
    data, fp32, fp32_acc = trained(lab)
    batch = data.serving_batch()
    with compress.quiet():
        q = quantize(compress.deployable(fp32), data.calibration(seed=lab.seed))
        if not isinstance(q, torch.nn.Module):
            raise StudentCodeError(f"quantize_int8 must return a model, not {type(q).__name__}")
        with torch.no_grad():
            want, got = fp32(batch), q(batch).float()
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
    small = judge("07-int8-size", ratio, lab.machine.as_dict(), correct=correct, why_incorrect=why,
                  note=f"{int8_bytes / 2**20:.1f} MiB vs {fp32_bytes / 2**20:.1f} MiB "
                       f"in fp32; logits within {error:.2%} of fp32's",
                  details={"bytes_ratio": ratio, "logit_error": error})
    if lab.profile.grades_speed and correct:
        compile_inference = carried("05", lab).compile_inference  # your 05 compile, for both sides
        torch.compiler.reset()
        with compress.serving():  # no_grad, and freezing on whatever 05 chose (int8 kernels need it)
            fast_fp32, fast_int8 = compile_inference(fp32), compile_inference(q)
            fast_fp32(batch), fast_int8(batch)  # the compiles, outside the timing
            cmp = measure.compare(lambda: fast_fp32(batch), lambda: fast_int8(batch), compress.CPU,
                                  rounds=lab.profile.rounds, steps_per_round=4 * lab.profile.steps_per_round)
        fast = speed(lab, "07-int8-speedup", cmp.speedup.median)
        fast = dataclasses.replace(fast, note=(fast.note + "; " if fast.note else "") +
                                   f"{cmp}; both compiled with your 05 compile_inference, batches of {len(batch)}",
                                   details=cmp.summary())
    else:
        fast = speed(lab, "07-int8-speedup", None, correct=correct, why_incorrect=why,
                     note="the int8 model runs")
    with compress.quiet():
        acc = compress.accuracy(q, data.val_images, data.val_labels) if correct else 0.0
    accurate = _gap_check("07-int8-accuracy", lab, fp32_acc, acc, correct=correct, why=why, what="int8")
    return [small, fast, accurate]
