"""07's worker side: the student's 07 functions called for 07's checks (:class:`Here`, which the
notebook's self-check calls in its own process), and what a worker may be asked of them
(:class:`Side`): the fp32 weights come in, and weights (pruning), an exported model as data
(quantisation, :mod:`.exported`) and losses with their gradients go back. No check and no
expected answer: those are the judge's (:mod:`.g07_compression`).
"""

from __future__ import annotations

import dataclasses

import torch

from .. import compress
from . import StudentCodeError, exported, student
from .watch import watched

_DATA: list = []  # the lab's images at 07's size, decoded once per process


def _data() -> compress.Data:
    if not _DATA:
        with compress.quiet():
            _DATA.append(compress.load_data(progress=False))
    return _DATA[0]


@dataclasses.dataclass
class Case:
    """One crafted input of ``distillation_loss``."""

    student: torch.Tensor  # (batch, classes) logits
    teacher: torch.Tensor
    labels: torch.Tensor
    alpha: float
    temperature: float


@dataclasses.dataclass
class Pruned:
    """What the student's pruning made of the fp32 weights it was given."""

    state: dict[str, torch.Tensor]  # the final model's tensors named as fp32's (a layer's weight_orig as its weight)
    names: list[str]  # every name in the final model's state dict
    masked: float  # the share of the weights zero right after prune_globally
    masks_through_tune: bool  # whether the masks were still there after the fine-tune
    hooks: int  # prunable layers that still run forward pre-hooks


class Here:
    """The student's 07 functions, called in this process (the notebook's self-check); the grader's
    judge passes its own ``sides``, which calls them in the student's worker and gets back weights
    and an exported model's description (:mod:`.exported`), as plain data."""

    def __init__(self, namespace: dict, lab):
        self.namespace, self.lab = namespace, lab

    def pruned(self, weights: dict[str, torch.Tensor]) -> Pruned:
        """``prune_globally(model, AMOUNT)``, the lab's fine-tune and ``make_permanent`` on a model
        holding ``weights``."""
        prune_globally = watched(student(self.namespace, "prune_globally", "07"), "prune_globally", "07")
        make_permanent = watched(student(self.namespace, "make_permanent", "07"), "make_permanent", "07")
        model, data = compress.model_from(weights), _data()
        with compress.quiet():
            pruned = prune_globally(model, compress.AMOUNT)
            if not isinstance(pruned, torch.nn.Module):
                raise StudentCodeError(f"prune_globally must return the model, not {type(pruned).__name__}")
            total = compress.sparsity(pruned).total
            masked = sum(int((m.weight == 0).sum()) for _, m in compress.prunable(pruned)) / max(total, 1)
            tuned = compress.fine_tune(pruned, self.lab, data, progress=False)
            kept = bool(compress.sparsity(tuned).masks_left)
            final = make_permanent(tuned)
            if not isinstance(final, torch.nn.Module):
                raise StudentCodeError(f"make_permanent must return the model, not {type(final).__name__}")
        state = final.state_dict()
        named = {name.removesuffix("_orig"): value for name, value in state.items()
                 if name.removesuffix("_orig") in weights and isinstance(value, torch.Tensor)}
        hooks = sum(1 for _, m in compress.prunable(final) if m._forward_pre_hooks)
        return Pruned({k: v.detach().to("cpu") for k, v in named.items()}, list(state), masked, kept, hooks)

    def quantized(self, weights: dict[str, torch.Tensor]) -> exported.Described:
        """``quantize_int8`` on a deployable model holding ``weights``, calibrated on the lab's
        batches, exported on a serving batch and described as data (:func:`.exported.describe`)."""
        quantize = student(self.namespace, "quantize_int8", "07")
        data = _data()
        with compress.quiet():
            q = quantize(compress.deployable(compress.model_from(weights)), data.calibration(seed=self.lab.seed))
            if not isinstance(q, torch.nn.Module):
                raise StudentCodeError(f"quantize_int8 must return a model, not {type(q).__name__}")
            try:
                return exported.describe(q, data.serving_batch())
            except exported.NotAModel as err:
                raise StudentCodeError(str(err)) from None

    def distill_losses(self, cases: list[Case]) -> list[tuple[float, torch.Tensor]]:
        """``distillation_loss`` on each crafted case: its value, and its gradient with respect to the
        student's logits."""
        fn = watched(student(self.namespace, "distillation_loss", "07"), "distillation_loss", "07")
        out = []
        for case in cases:
            logits = case.student.clone().requires_grad_(True)
            value = fn(logits, case.teacher.clone(), case.labels.clone(), case.alpha, case.temperature)
            if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.requires_grad:
                raise StudentCodeError("distillation_loss must return a one-element tensor computed from the "
                                       f"student's logits (it returned {type(value).__name__})")
            value.backward()
            grad = logits.grad if logits.grad is not None else torch.zeros_like(logits)
            out.append((float(value.detach()), grad.detach().float()))
        return out

    def distilled(self, lab, data: compress.Data, teacher: torch.nn.Module, seed: int) -> torch.nn.Module:
        """The small network distilled from ``teacher`` with the student's ``distillation_loss``."""
        fn = student(self.namespace, "distillation_loss", "07")
        return compress.train_small(lab, data, seed=seed, teacher=teacher, loss=fn)



def _weights(names: list, tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The fp32 weights the judge sent: its names, and the tensors in the shared buffer."""
    if len(names) != len(tensors):
        raise ValueError("weights sent without their names")
    return dict(zip((str(n) for n in names), tensors))


class Side:
    """07 in the student's worker: their pruning and quantisation on the fp32 weights sent, their
    ``distillation_loss`` on the crafted cases sent, each answer as plain data and tensors."""

    ASKED = ("pruned", "quantized", "distill_losses")

    def __init__(self, namespace: dict, lab, *, student: bool):
        if not student:
            raise PermissionError("the baseline's worker holds no student code (07)")
        self.here = Here(namespace, lab)

    def pruned(self, *, names: list, tensors: list) -> dict:
        """The weights the pruning left, named as fp32's (:class:`Pruned`)."""
        got = self.here.pruned(_weights(names, tensors))
        kept = list(got.state)
        return {"names": kept, "tensors": [got.state[n] for n in kept], "all": [n[:200] for n in got.names[:2000]],
                "masked": float(got.masked), "masks_through_tune": bool(got.masks_through_tune), "hooks": int(got.hooks)}

    def quantized(self, *, names: list, tensors: list) -> list[torch.Tensor]:
        """The int8 model exported and described as data: its nodes as JSON bytes, then its tensors."""
        described = self.here.quantized(_weights(names, tensors))
        return [described.encoded(), *described.tensors]

    def distill_losses(self, *, tensors: list, alphas: list, temperatures: list) -> dict:
        """Each crafted case's loss value, and its gradients stacked (student and teacher logits
        and labels came as three tensors; a weight and a temperature each)."""
        students, teachers, labels = tensors
        cases = [Case(s, t, y, float(a), float(temp)) for s, t, y, a, temp in
                 zip(students, teachers, labels, alphas, temperatures)]
        got = self.here.distill_losses(cases)
        return {"values": [v for v, _ in got], "tensors": [torch.stack([g for _, g in got])]}
