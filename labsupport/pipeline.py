"""The input pipeline: the deliberately naive loader that notebooks 01 and 02 profile and then fix.

The naive pipeline is what a first training script usually looks like: decode each JPEG with PIL
and augment it sample by sample in the main process (``num_workers=0``), no pinned memory, so the
model waits while the CPU prepares every batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from torchvision import transforms

from . import dataset
from .hardware import Profile

# ImageNet statistics, as in torchvision's reference scripts; the lab's images are normalised the
# same way whichever dataset is used, so results stay comparable.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def naive_transform(image_size: int, augment: bool = True) -> transforms.Compose:
    """Per-sample PIL augmentation, as in the ImageNet reference recipe (Used by: 01, 02).

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


def naive_loader(profile: Profile, *, root: Path | str | None = None, split: str = "train",
                 augment: bool = True, seed: int = 0) -> DataLoader:
    """The baseline loader: PIL in the main process, no workers, no pinned memory (Used by: 01, 02).

    ``root`` defaults to the lab dataset, generated on first use; any ImageFolder tree with
    ``train/`` and ``val/``, or a folder holding CIFAR-10's ``cifar-10-batches-py``, also works.
    """
    root = dataset.ensure() if root is None else Path(root)
    data = dataset.open_split(root, split, transform=naive_transform(profile.image_size, augment))
    return DataLoader(data, batch_size=profile.batch_size, shuffle=(split == "train"),
                      num_workers=0, pin_memory=False, drop_last=(split == "train"),
                      generator=torch.Generator().manual_seed(seed))


def forever(loader) -> Iterator:
    """Yield batches from ``loader`` epoch after epoch, for step-count-driven loops (Used by: 01-06)."""
    while True:
        yielded = False
        for batch in loader:
            yielded = True
            yield batch
        if not yielded:
            raise ValueError("The loader yielded no batches: is the dataset smaller than a batch?")
