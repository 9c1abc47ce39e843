"""Correctness partners shared by the graded checks: each returns ``(ok, why-not)``.

A fast but wrong answer must fail, so every speed or memory check pairs its measurement with one
of these (Used by: the graded checks of 02, 03, 04 and 06).
"""

from __future__ import annotations

import itertools

import torch


def same_batches(reference, candidate, max_batches: int | None = None) -> tuple[bool, str]:
    """True if two loaders yield identical images and labels, batch for batch (augmentation off).

    Used by: the 02 loader check (a fast loader must deliver the naive loader's data).
    """
    ref_it, cand_it = iter(reference), iter(candidate)
    for i in itertools.count():
        if max_batches is not None and i >= max_batches:
            return True, ""
        ref, cand = next(ref_it, None), next(cand_it, None)
        if ref is None or cand is None:
            if ref is cand:
                return True, ""
            return False, (f"your loader {'ended' if cand is None else 'went on'} at batch {i}, "
                           f"where the naive loader {'went on' if cand is None else 'ended'}")
        (ref_x, ref_y), (cand_x, cand_y) = ref, cand
        cand_x = cand_x.to("cpu", torch.float32).contiguous()
        if cand_x.shape != ref_x.shape or not torch.equal(cand_y.cpu(), ref_y):
            return False, (f"batch {i}: images {tuple(cand_x.shape)} / labels differ from the "
                           f"naive loader's {tuple(ref_x.shape)}")
        err = (cand_x - ref_x).abs().max().item()
        if err > 1e-5:
            return False, f"batch {i}: pixel values differ from the naive loader's by up to {err:.3g}"


def same_epoch_labels(expected, seen, batch_size: int) -> tuple[bool, str]:
    """True if one epoch saw every sample's label once, up to a dropped last partial batch.

    Used by: the 02 loader check (an augmenting, shuffling loader must still see every sample).
    """
    expected = torch.as_tensor(expected).flatten()
    seen = torch.as_tensor(seen).flatten()
    n_classes = int(max(expected.max(), seen.max() if seen.numel() else 0)) + 1
    missing = torch.bincount(expected, minlength=n_classes) - torch.bincount(seen, minlength=n_classes)
    if (missing < 0).any():
        return False, f"labels seen more often than the dataset holds them: {(-missing).clamp(min=0).tolist()}"
    if missing.sum() >= batch_size:
        return False, (f"one epoch saw {seen.numel()} of {expected.numel()} samples; more than a "
                       f"partial last batch ({batch_size - 1}) is missing")
    return True, ""


def step_trains(step, images, labels, steps: int = 3) -> tuple[bool, str]:
    """True if calling ``step(images, labels)`` a few times changes the weights, all finite.

    Catches a step that skips backward or the optimizer, and an fp16 step without a scaler whose
    overflowing gradients write inf/NaN into the weights. Used by: the 03 and 04 checks.
    """
    params = [p for p in step.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    for i in range(steps):
        loss = step(images, labels)
        if not torch.isfinite(torch.as_tensor(loss)).all():
            return False, f"step {i} returned a non-finite loss ({float(loss)})"
    if not all(torch.isfinite(p).all() for p in params):
        return False, "inf/NaN values were written into the weights (fp16 without a GradScaler?)"
    if all(torch.equal(p, b) for p, b in zip(params, before)):
        return False, f"the weights did not change in {steps} steps: is backward or optimizer.step() skipped?"
    return True, ""


def first_mismatch(name: str, got: list, want: list, rtol: float, atol: float) -> str:
    """The first of two tensor lists that differ beyond tolerance, as a sentence ("" if none do)."""
    for i, (g, w) in enumerate(zip(got, want)):
        try:
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
        except AssertionError as err:
            return f"{name} #{i} differs: {str(err).splitlines()[-1].strip() or err}"
    return "" if len(got) == len(want) else f"{len(got)} {name} instead of {len(want)}"
