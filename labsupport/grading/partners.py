"""Correctness partners shared by the graded checks: each returns ``(ok, why-not)``.

A fast but wrong answer must fail, so every speed or memory check pairs its measurement with one
of these.
"""

from __future__ import annotations

import itertools

import torch

from .timed import Call, FromOneStart, snapshot  # noqa: F401 (re-exported: the partners check what these kept)


def same_batches(reference, candidate, max_batches: int | None = None) -> tuple[bool, str]:
    """True if two loaders yield identical images and labels, batch for batch (augmentation off):
    a fast loader must deliver the naive loader's data."""
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
    """True if one epoch saw every sample's label once, up to a dropped last partial batch: an
    augmenting, shuffling loader must still see every sample."""
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
    """True if calling ``step(images, labels)`` a few times changes every weight tensor, all finite.

    Catches a step that skips backward or the optimizer, one that trains only some layers (the
    last one, say), and an fp16 step without a scaler whose overflowing gradients write inf/NaN
    into the weights. Every parameter of the lab's ResNet-18 gets a gradient from every batch, so
    a step that trains changes them all.
    """
    params = list(step.model.parameters())  # all of them: a step may not freeze layers either
    before = [p.detach().clone() for p in params]
    for i in range(steps):
        loss = step(images, labels)
        if not torch.isfinite(torch.as_tensor(loss)).all():
            return False, f"step {i} returned a non-finite loss ({float(loss)})"
    return weights_trained(before, params, [n for n, _ in step.model.named_parameters()], steps)


def weights_trained(before: list[torch.Tensor], after: list[torch.Tensor], names: list[str],
                    steps: int) -> tuple[bool, str]:
    """True if every weight tensor changed between ``before`` and ``after`` (``steps`` steps apart),
    and all are finite: :func:`step_trains`'s verdict, also on weights a worker sent back."""
    if len(before) != len(after) or any(b.shape != a.shape for b, a in zip(before, after)):
        return False, "the weights after the steps are not the model's weights"
    if not all(torch.isfinite(p).all() for p in after):
        return False, "inf/NaN values were written into the weights (fp16 without a GradScaler?)"
    if all(torch.equal(p, b) for p, b in zip(after, before)):
        return False, f"the weights did not change in {steps} steps: is backward or optimizer.step() skipped?"
    frozen = [name for name, p, b in zip(names, after, before) if torch.equal(p, b)]
    if frozen:
        return False, (f"{len(frozen)} of {len(after)} weight tensors did not change in {steps} steps "
                       f"({', '.join(frozen[:3])}...): the step must update every layer of the model")
    return True, ""


def first_mismatch(name: str, got: list, want: list, rtol: float, atol: float | list[float]) -> str:
    """The first of two tensor lists that differ beyond tolerance, as a sentence ("" if none do).
    ``atol`` is one absolute tolerance, or one per tensor."""
    atols = atol if isinstance(atol, (list, tuple)) else [atol] * len(want)
    for i, (g, w, a) in enumerate(zip(got, want, atols)):
        try:
            torch.testing.assert_close(g, w, rtol=rtol, atol=a)
        except AssertionError as err:
            return f"{name} #{i} differs: {str(err).splitlines()[-1].strip() or err}"
    return "" if len(got) == len(want) else f"{len(got)} {name} instead of {len(want)}"


# At most this share of augmented images may be dataset images exactly, or repeat across epochs
# (the naive loader's: 0; a loader that skips augmentation: all of them).
AUGMENTED_AT_MOST_PLAIN = 0.5
# Augmented images at least this sharp, relative to the naive loader's augmented images measured in
# the same check. Measured (mean |horizontal difference|, class cpu, 64 px, 6 batches): naive
# 0.119, the reference loader 0.128 (1.08x), decoded at half size and scaled up 0.084 (0.70x), at
# three quarters 0.094 (0.79x); at the tiny test profile (32 px) 1.04x, 0.63x and 0.79x.
SHARPNESS_FLOOR = 0.8


def unaugmented_share(batches, sources: torch.Tensor, tolerance: float = 1e-4) -> float:
    """The share of the images in ``batches`` (``(images, labels)`` pairs) that are one of
    ``sources`` exactly (the dataset at the profile's size, augmentation off)."""
    keys, hits, total = _fingerprints(sources), 0, 0
    for x, _ in batches:
        x = x.to("cpu", torch.float32)
        if x.dim() != 4 or x.shape[1:] != sources.shape[1:]:
            continue  # a shape the checks report on their own
        match = torch.cdist(_fingerprints(x), keys).argmin(dim=1)
        hits += int(((x - sources[match]).abs().amax(dim=(1, 2, 3)) <= tolerance).sum())
        total += len(x)
    return hits / total if total else 0.0


def _fingerprints(images: torch.Tensor) -> torch.Tensor:
    """A 4 x 4 average-pooled copy of each image, flattened: which source image this is."""
    return torch.nn.functional.adaptive_avg_pool2d(images.float(), 4).flatten(1).double()


def paired_with_sources(loader, sources: torch.Tensor, labels: torch.Tensor,
                        tolerance: float = 1e-4) -> tuple[bool, str]:
    """True if every image ``loader`` yields (augmentation off) is one of ``sources`` at full
    resolution, exactly, and comes with that source's label; ``sources`` are normalised float
    images (N x 3 x H x W, the naive loader's evaluation transform) with their ``labels``.

    Catches a loader that pairs images with the wrong labels, and one that decodes at a lower
    resolution and resizes up to the right shape.
    """
    keys = _fingerprints(sources)
    for i, (x, y) in enumerate(loader):
        x, y = x.to("cpu", torch.float32), y.cpu()
        if x.shape[1:] != sources.shape[1:]:
            return False, f"batch {i}: images {tuple(x.shape[1:])}, expected {tuple(sources.shape[1:])}"
        distance = torch.cdist(_fingerprints(x), keys)
        match = distance.argmin(dim=1)
        err = (x - sources[match]).abs().amax(dim=(1, 2, 3))
        for j in (err > tolerance).nonzero().flatten().tolist():  # a tie of fingerprints: try them all
            tied = (distance[j] <= distance[j, match[j]] + 1e-9).nonzero().flatten()
            errs = (x[j] - sources[tied]).abs().flatten(1).amax(dim=1)
            match[j], err[j] = tied[errs.argmin()], errs.min()
        if (err > tolerance).any():
            j = int(err.argmax())
            return False, (f"batch {i}, image {j}: no image of the dataset at {sources.shape[-1]} px matches "
                           f"it (pixels off by up to {float(err[j]):.3g}): decode at full resolution, "
                           "then resize once to the profile's size, as the naive loader does")
        wrong = (labels[match] != y).nonzero().flatten()
        if wrong.numel():
            j = int(wrong[0])
            return False, (f"batch {i}, image {j}: labelled {int(y[j])}, but it is an image of class "
                           f"{int(labels[match][j])}: keep each image with its own label")
    return True, ""


class EpochRecorder:
    """A loader that remembers what it yielded, epoch by epoch, without slowing the loop down.

    Wraps the loader a speed check times: each epoch's labels are copied, on their own device
    and without a synchronisation, into one buffer allocated when the epoch starts, and checked
    afterwards with :meth:`problems`. One buffer, not the yielded tensors: keeping 150 small
    label tensors alive made each epoch of 02's reference loader 30% slower (0.66 s to 0.87 s at
    64 px, class cpu; the allocator can no longer hand a freed batch's memory back).
    """

    def __init__(self, loader):
        self.loader, self.epochs, self.complete, self.kinds = loader, [], [], set()
        # Per epoch: each batch's (sum, sum of squares) of a strided sample of its images, then the
        # sum and count of absolute differences between horizontally adjacent pixels (every 5th row):
        # how sharp the images are; and each image's own sum over the strided sample.
        self.prints: list = []
        self.images: list = []

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        self.epochs.append(None)
        self.complete.append(False)
        self.prints.append(None)
        self.images.append(None)
        buffer, used, prints, n, faces, seen = None, 0, None, 0, None, 0
        for x, y in self.loader:
            self.kinds.add((tuple(x.shape[1:]), x.dtype))
            y_flat = y.reshape(-1)
            if buffer is None:
                buffer = y_flat.new_empty((len(self.loader) + 1) * y_flat.numel())
                prints = torch.zeros((len(self.loader) + 1, 4), dtype=torch.float64, device=x.device)
                faces = torch.empty(buffer.numel(), dtype=torch.float64, device=x.device)
            if used + y_flat.numel() > buffer.numel():  # more than len() promised: grow
                buffer = torch.cat([buffer, y_flat.new_empty(max(buffer.numel(), y_flat.numel()))])
            if n == len(prints):
                prints = torch.cat([prints, torch.zeros_like(prints)])
            buffer[used:used + y_flat.numel()].copy_(y_flat, non_blocking=True)
            used += y_flat.numel()
            # A strided view (a 25th of the batch, no copy of it), queued on the batch's device: the
            # same batch served twice in an epoch gives the same two numbers.
            sample = (x[..., ::5, ::5] if x.dim() >= 2 else x).double()
            prints[n, 0], prints[n, 1] = sample.sum(), sample.square().sum()
            if x.dim() == 4 and x.shape[-1] > 1:
                rows = x[..., ::5, :]
                prints[n, 2] = (rows[..., 1:] - rows[..., :-1]).abs().double().sum()
                prints[n, 3] = rows[..., 1:].numel()
                if seen + len(x) > faces.numel():
                    faces = torch.cat([faces, torch.empty_like(faces[:max(faces.numel(), len(x))])])
                faces[seen:seen + len(x)] = sample.flatten(1).sum(1)
                seen += len(x)
            n += 1
            self.epochs[-1], self.prints[-1], self.images[-1] = buffer[:used], prints[:n], faces[:seen]
            yield x, y
        self.complete[-1] = True

    def sharpness(self) -> float | None:
        """The mean absolute difference between horizontally adjacent pixels, over every batch
        recorded (None before any): lower for images decoded small and scaled up."""
        found = [p.cpu() for p in self.prints if p is not None]
        if not found:
            return None
        found = torch.cat(found)
        return float(found[:, 2].sum() / found[:, 3].sum()) if found[:, 3].sum() > 0 else None

    def repeated_share(self) -> float | None:
        """The share of images in later epochs that are, exactly, an image of the first epoch (None
        with fewer than two epochs): about 0 when every epoch is augmented afresh."""
        epochs = [f.cpu() for f in self.images if f is not None and len(f)]
        if len(epochs) < 2:
            return None
        first, later = torch.round(epochs[0] * 1e6), torch.round(torch.cat(epochs[1:]) * 1e6)
        return float(torch.isin(later, first).double().mean())

    def augmentation_problems(self, naive: "EpochRecorder", first_batches, sources: torch.Tensor) -> str:
        """What shows the timed training batches are not augmented as the naive loader's are ("" if
        nothing): most images of the first batches are dataset images exactly (augmentation
        skipped), images repeat exactly across epochs, or the images are blurrier than the naive
        loader's augmented ones, recorded while both were timed (decoded small, scaled up)."""
        plain = unaugmented_share(first_batches, sources)
        if plain > AUGMENTED_AT_MOST_PLAIN:
            return (f"{100 * plain:.0f}% of the images of your first augmented training batches are dataset "
                    "images exactly, unaugmented: augment=True must crop, flip and jitter as the naive loader does")
        repeated = self.repeated_share()
        if repeated is not None and repeated > AUGMENTED_AT_MOST_PLAIN:
            return (f"{100 * repeated:.0f}% of the images of your later training epochs repeat the first "
                    "epoch's exactly: augment each epoch afresh, as the naive loader does")
        mine, theirs = self.sharpness(), naive.sharpness()
        if mine is not None and theirs and mine < SHARPNESS_FLOOR * theirs:
            return (f"your augmented training images are blurrier than the naive loader's (mean difference "
                    f"between neighbouring pixels {mine:.3g} against {theirs:.3g}, {mine / theirs:.2f}x, "
                    f"below {SHARPNESS_FLOOR:g}x): decode at full resolution, then crop and resize once, as "
                    "the naive loader does")
        return ""

    def problems(self, expected, batch_size: int, kinds: set) -> str:
        """What was wrong with any epoch that was timed ("" if nothing): no batch is served twice in
        an epoch (finished or not), every complete epoch sees every sample's label once, an epoch
        cut short sees none too often, every batch has the expected shape and dtype."""
        if self.kinds - kinds:
            return f"timed batches had shapes/dtypes {self.kinds - kinds}, expected {kinds}"
        expected = torch.as_tensor(expected).flatten()
        counts = torch.bincount(expected)
        for n, prints in enumerate(self.prints, 1):
            if prints is not None and len(prints) > 1:
                found = torch.nan_to_num(prints.cpu())
                if len(torch.unique(found, dim=0)) < len(found):
                    return (f"timed epoch {n}: the same batch was served more than once (an epoch must "
                            "go through the data, not repeat a batch)")
        for n, (labels, complete) in enumerate(zip(self.epochs, self.complete), 1):
            seen = expected[:0] if labels is None else labels.cpu()
            if complete:
                ok, why = same_epoch_labels(expected, seen, batch_size)
                if not ok:
                    return f"timed epoch {n}: {why}"
            elif seen.numel():
                extra = torch.bincount(seen, minlength=len(counts))[:len(counts)] - counts
                if (extra > 0).any() or seen.max() >= len(counts):
                    return f"timed epoch {n}: labels seen more often than the dataset holds them"
        return ""


MIN_COSINE = 0.8  # an honest bf16 or fp16 update against fp32's, one step from the same weights: 0.93-1.0
#                  (64 and 32 px), 0.86-0.94 for bf16 at the tiny profile (64 samples, 32 calls, class cpu)
UPDATE_RATIO = (0.5, 2.0)  # its size against fp32's: 0.90-1.03 (64 and 32 px, class cpu)
LAYER_SHARE = 0.1  # each weight tensor's sampled update, at least this share of fp32's


def updates_alike(calls: list[Call], wants: list[torch.Tensor], names: list[str], *, of: str = "timed call",
                  baseline: str = "fp32's step", convolutions: int | None = None) -> tuple[bool, str]:
    """True if each call trained as the baseline's step trains from the same start on the same
    batch (``wants[i]``: its update at the same sampled positions): a finite loss, and an update
    pointing the same way (cosine over the samples), of about the same size, in every weight
    tensor. Measured at 32 and 64 px on class cpu, one step of the reference's bfloat16 and
    float16 steps against fp32's: cosine 0.93-1.0, size 0.90-1.03; a step that skips backward,
    skips every other call or trains on half-resolution images: cosine 0 to 0.39.
    ``convolutions``: how many convolutions an untimed call of the step ran; every call must run
    as many (a checkpointed step that skips its recomputation when timed does not).
    """
    if not calls or len(calls) != len(wants):
        return False, f"{len(calls)} calls of your step to compare with {len(wants)} of {baseline}"
    for number, (call, want) in enumerate(zip(calls, wants), start=1):
        what = f"{of} {number} of {len(calls)}"
        if not torch.isfinite(call.loss).all():
            return False, f"{what} returned a non-finite loss ({float(call.loss)})"
        if convolutions is not None and call.convolutions != convolutions:
            return False, (f"{what} ran {call.convolutions} convolutions (forward and recomputed), an "
                           f"untimed call {convolutions}: a step must do the same work whenever it is called, "
                           "timed or not")
        got, want_flat = call.update.flatten(), want.flatten()
        size = float(got.norm() / want_flat.norm())
        cosine = float(got @ want_flat / (got.norm() * want_flat.norm()).clamp_min(1e-30))
        # Layers the baseline moved (at 32 px layer4's 3 x 3 kernels see a 1 x 1 map: only their
        # centre gets a gradient, so most samples there stay put on either side).
        moved = want.norm(dim=1)
        counted = moved > 1e-3 * moved.max()
        shares = call.update.norm(dim=1) / moved.clamp_min(1e-30)
        still = [name for name, share, c in zip(names, shares.tolist(), counted.tolist()) if c and share < LAYER_SHARE]
        if not torch.isfinite(got).all() or cosine < MIN_COSINE or not UPDATE_RATIO[0] <= size <= UPDATE_RATIO[1] \
                or still:
            return False, (f"{what} did not train as {baseline} does from the same weights on the same "
                           f"batch: its update's cosine with that step's is {cosine:.2f} (at least {MIN_COSINE} "
                           f"needed), its size {size:.2f} times that step's"
                           + (f", and {len(still)} weight tensors barely moved ({', '.join(still[:3])})" if still else "")
                           + ". A step must do the same work whenever it is called, timed or not")
    return True, ""
