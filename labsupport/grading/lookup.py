"""The student's code as a check finds it: a function of the notebook's namespace (:func:`student`),
what an earlier notebook carried forward (:func:`carried`), a file this kernel wrote
(:func:`written_now`), and the naive loader's first batch the checks feed it (:func:`one_batch`).
What is missing or broken raises a :class:`StudentCodeError` that says what to run or fix."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .. import carry, hardware, pipeline


class StudentCodeError(RuntimeError):
    """The student's function is missing or broke its contract; the message says what to fix."""


def student(namespace: dict, name: str, number: str) -> Callable:
    """The student's function ``name`` from the notebook's namespace, or a StudentCodeError."""
    fn = namespace.get(name)
    if not callable(fn):
        raise StudentCodeError(f"`{name}` is not defined: write it in notebook {number}'s solution "
                               "cell and run that cell before the checks.")
    return fn


def carried(number: str, lab) -> object:
    """Notebook ``number``'s graded functions as its checks last measured them (:mod:`labsupport.carry`).

    A StudentCodeError names the notebook to run when they are missing.
    """
    try:
        return carry.load(number, lab=lab)
    except carry.CarryError as err:
        raise StudentCodeError(str(err)) from None


def one_batch(lab: hardware.Lab, batch_size: int | None = None, image_size: int | None = None, seed: int = 0,
              augment: bool = True):
    """The naive loader's first batch at the profile's (or the given) size: ``(images, labels)`` on the
    CPU. Without ``augment`` it is the same batch in every process (augmentation draws from torch's
    global generator)."""
    import dataclasses

    profile = dataclasses.replace(lab.profile, batch_size=batch_size or lab.profile.batch_size,
                                  image_size=image_size or lab.profile.image_size)
    return next(iter(pipeline.naive_loader(profile, seed=seed, augment=augment)))


def process_start_s() -> float | None:
    """When this kernel started (for "written by this kernel" checks), or None without psutil.

    In the grader's verdict process, the kernel's start comes from ``LAB_WRITTEN_SINCE`` (the
    grader sets it; the files checked were written by the kernel that ran before it)."""
    import os

    if os.environ.get("LAB_WRITTEN_SINCE"):
        return float(os.environ["LAB_WRITTEN_SINCE"])
    try:
        import psutil
        return psutil.Process().create_time()
    except Exception:  # no psutil: the freshness test is skipped, the content test still runs
        return None


def written_now(path: Path, cell: str) -> Path:
    """``path``, checked to exist and to have been written by this kernel; else a StudentCodeError
    naming ``cell``, the cell that writes it."""
    if not path.is_file():
        raise StudentCodeError(f"{path} does not exist: run {cell}, which writes it.")
    started = process_start_s()
    if started is not None and path.stat().st_mtime < started - 1:
        raise StudentCodeError(f"{path} is older than this kernel: run {cell} again.")
    return path
