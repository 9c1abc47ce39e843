"""The input pipeline: the naive loader that notebooks 01 and 02 profile, and the parts of a fast one.

The naive pipeline is what a first training script usually looks like: decode each JPEG with PIL
and augment it sample by sample in the main process (``num_workers=0``), no pinned memory, so the
model waits while the CPU prepares every batch.

A fixed pipeline does the expensive work once and the per-batch work in batches: :func:`decode_once`
decodes every JPEG a single time into a uint8 tensor, and :func:`batch_augment` crops, flips and
colour-jitters a whole batch with a few tensor ops, on whichever device trains. Notebook 02 asks
the student to build that loader from these parts; 03-06 use the student's loader, carried
forward (:mod:`labsupport.carry`).
"""

from __future__ import annotations

import gc
import math
from pathlib import Path
from time import perf_counter as _clock  # bound at import: code that patches time does not move it

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import transforms

from . import dataset
from .hardware import Profile

# ImageNet statistics, as in torchvision's reference scripts; the lab's images are normalised the
# same way whichever dataset is used, so results stay comparable.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
LUMA = (0.299, 0.587, 0.114)  # batch_augment's grey for contrast and saturation (ITU-R 601 weights)


def naive_transform(image_size: int, augment: bool = True) -> transforms.Compose:
    """Per-sample PIL augmentation, as in the ImageNet reference recipe.

    ``augment=False`` gives a deterministic resize and centre crop, so two loaders can be
    compared image for image.
    """
    if augment:
        steps = [transforms.RandomResizedCrop(image_size, scale=(0.35, 1.0), antialias=True),
                 transforms.RandomHorizontalFlip(),
                 transforms.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4)]
    else:
        steps = [transforms.Resize(image_size, antialias=True), transforms.CenterCrop(image_size)]
    return transforms.Compose([*steps, transforms.ToTensor(), transforms.Normalize(MEAN, STD)])


# A line profiler reports per line of a function's source file, and memory_profiler's cannot read
# a function defined in a notebook: it needs one in a file, such as this one.
def transform_by_line(image, steps):
    """The naive transform's five steps (``naive_transform(size).transforms``), one per line."""
    image = steps[0](image)  # RandomResizedCrop
    image = steps[1](image)  # RandomHorizontalFlip
    image = steps[2](image)  # ColorJitter
    tensor = steps[3](image)  # ToTensor
    return steps[4](tensor)  # Normalize


def naive_loader(profile: Profile, *, root: Path | str | None = None, split: str = "train",
                 augment: bool = True, seed: int = 0) -> DataLoader:
    """The baseline loader: PIL in the main process, no workers, no pinned memory.

    ``root`` defaults to the lab dataset, generated on first use; any ImageFolder tree with
    ``train/`` and ``val/``, or a folder holding CIFAR-10's ``cifar-10-batches-py``, also works.
    """
    root = dataset.ensure() if root is None else Path(root)
    data = dataset.open_split(root, split, transform=naive_transform(profile.image_size, augment))
    return DataLoader(data, batch_size=profile.batch_size, shuffle=(split == "train"),
                      num_workers=0, pin_memory=False, drop_last=(split == "train"),
                      generator=torch.Generator().manual_seed(seed))


class forever:  # noqa: N801 (lower case: it is called like a function)
    """Yield batches from ``loader`` epoch after epoch, for step-count-driven loops.

    It keeps no batch once handed out: a batch still held here would be freed inside the caller's
    next step, which the memory profiler reports as a block "allocated before the profiling
    started". With ``timed=True`` it records how long each batch took to arrive, in ``waits_ms``:
    the pipeline's data wait, measured in the run itself (06's end-to-end check reports it).
    """

    def __init__(self, loader, *, timed: bool = False):
        self.loader, self._batches, self._fresh = loader, iter(loader), True
        self.waits_ms: list[float] | None = [] if timed else None

    def __iter__(self):
        return self

    def __next__(self):
        if self.waits_ms is None:
            return self._next()
        t0 = _clock()
        batch = self._next()
        self.waits_ms.append((_clock() - t0) * 1000)
        return batch

    def _next(self):
        while True:
            try:
                batch = next(self._batches)
            except StopIteration:
                if self._fresh:
                    raise ValueError("The loader yielded no batches: is the dataset smaller than a batch?") from None
                self._batches, self._fresh = iter(self.loader), True
                continue
            self._fresh = False
            return batch


def decode_once(split: str = "train", *, size: int | None = None, root: Path | str | None = None,
                workers: int | None = None, progress: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode every image of a split once: ``(uint8 images N x 3 x H x W, int64 labels)``.

    ``size=None`` keeps the stored resolution, for :func:`batch_augment` to crop from. ``size=S``
    applies the naive loader's evaluation transform (resize, centre crop) with PIL, so that
    ``normalize(images)`` equals the naive loader's ``augment=False`` batches exactly. Decoding
    is the one place worker processes pay on any machine: it happens once, in parallel.
    """
    from torchvision.transforms.functional import pil_to_tensor

    root = dataset.ensure() if root is None else Path(root)
    steps = [] if size is None else [transforms.Resize(size, antialias=True), transforms.CenterCrop(size)]
    data = dataset.open_split(root, split, transform=transforms.Compose([*steps, pil_to_tensor]))
    workers = min(4, torch.get_num_threads()) if workers is None else workers
    if workers:
        # Collect garbage before the workers fork: a DataLoader iterator abandoned mid-epoch in
        # a reference cycle would otherwise be collected inside a worker too, whose __del__ then
        # prints "AssertionError: can only test a child process" (harmless, but alarming).
        gc.collect()
    loader = DataLoader(data, batch_size=256, num_workers=workers, shuffle=False)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(loader), desc=f"decoding {split} once", leave=False)
    images, labels = [], []
    # The loader is iterated here, to its end, and not through tqdm: an iterator wrapped by tqdm
    # was left with its workers running, and collecting it later stalled 5 s on joining them.
    for x, y in loader:
        images.append(x)
        labels.append(y)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return torch.cat(images), torch.cat(labels)


_CHANNEL_CONSTANTS: dict[tuple[tuple[float, ...], torch.device], torch.Tensor] = {}


def _per_channel(values: tuple[float, ...], device: torch.device | str) -> torch.Tensor:
    """``values`` as a (1, 3, 1, 1) float32 tensor on ``device``, made once per device and reused.

    Made per batch on a GPU, each is a copy from pageable host memory, which waits for the GPU to
    finish the work queued before it: the CPU could never run ahead of the GPU (issue 35). Made
    outside inference mode, so that a tensor first made under it is usable everywhere."""
    key = (values, torch.device(device))
    constant = _CHANNEL_CONSTANTS.get(key)
    if constant is None:
        with torch.inference_mode(False):
            constant = _CHANNEL_CONSTANTS[key] = torch.tensor(values, device=device).view(1, 3, 1, 1)
    return constant


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 images to normalised float32, the same arithmetic as ToTensor + Normalize."""
    mean, std = _per_channel(MEAN, images.device), _per_channel(STD, images.device)
    return (images.float().div(255) - mean) / std


def batch_augment(images: torch.Tensor, size: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """The naive loader's augmentation for a whole uint8 batch at once; returns normalised float32.

    RandomResizedCrop (scale 0.35-1, aspect 3/4-4/3) and the horizontal flip become one affine
    sampling grid per image (``F.affine_grid`` + ``F.grid_sample``, bilinear); ColorJitter's
    brightness, contrast and saturation (0.4 each) become per-image factors. Random numbers come
    from ``generator`` (on the images' device).
    """
    n, device = images.shape[0], images.device
    rand = lambda *shape: torch.rand(*shape, device=device, generator=generator)  # noqa: E731
    area = 0.35 + 0.65 * rand(n)
    log_ratio = math.log(3 / 4) + (math.log(4 / 3) - math.log(3 / 4)) * rand(n)
    ratio = log_ratio.exp()
    # Crop width and height as fractions of the image, clipped to fit (RandomResizedCrop retries
    # until a crop fits; clipping gives the same range of views without a loop).
    w = (area * ratio).sqrt().clamp(max=1.0)
    h = (area / ratio).sqrt().clamp(max=1.0)
    cx = (1 - w) * (2 * rand(n) - 1)  # crop centre in [-1, 1] grid units, staying inside
    cy = (1 - h) * (2 * rand(n) - 1)
    flip = torch.where(rand(n) < 0.5, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3, device=device)
    theta[:, 0, 0], theta[:, 0, 2] = w * flip, cx
    theta[:, 1, 1], theta[:, 1, 2] = h, cy
    grid = F.affine_grid(theta, [n, 3, size, size], align_corners=False)
    x = F.grid_sample(images.float().div_(255), grid, mode="bilinear", padding_mode="border",
                      align_corners=False)
    # ColorJitter(0.4, 0.4, 0.4): factors uniform in [0.6, 1.4], applied as torchvision does. In
    # place, because at this size every extra full-batch temporary costs as much as an op.
    brightness, contrast, saturation = (0.6 + 0.8 * rand(n, 1, 1, 1) for _ in range(3))
    luma = _per_channel(LUMA, device)
    x.mul_(brightness).clamp_(0, 1)
    mean_gray = (x * luma).sum(dim=1, keepdim=True).mean(dim=(2, 3), keepdim=True)
    x.mul_(contrast).add_((1 - contrast) * mean_gray).clamp_(0, 1)
    gray = (x * luma).sum(dim=1, keepdim=True)
    x.mul_(saturation).add_((1 - saturation) * gray).clamp_(0, 1)
    # Normalize as one fused multiply-add: (x - mean) / std = x * (1 / std) - mean / std.
    std, mean = _per_channel(STD, device), _per_channel(MEAN, device)
    return torch.addcmul(-mean / std, x, 1 / std)
