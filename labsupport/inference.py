"""What 07 measures a model by, on the CPU: its sparsity, its bytes, the weights a forward reads,
its latency per request and its accuracy.

Each reads the model as it is stored and runs, never as it says it is: zeros counted in the weights
a state dict saves (not in pruning's masks), bytes in the tensors the model's graph reads, the
weights a forward computes with seen operator by operator. Inference is served in requests of
:data:`SERVE_BATCH` images on the CPU, whatever device trained the model: int8 through oneDNN is a
CPU deployment path. Re-exported by :mod:`labsupport.compress` (``ls.compress.sparsity``, ...).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from . import measure

SERVE_BATCH = 32  # images per inference request, as a service batches them
CPU = torch.device("cpu")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence what torchao and the PT2E flow print that is not a fault.

    - importing torchao logs that its ``KernelPreference`` enum is now natively supported by
      torch.compile (torch/utils/_pytree.py), a note to torchao's developers;
    - ``convert_pt2e`` warns that it builds a tensor from a tensor (``torch.tensor(w_zp_tensor)``);
    - Inductor's C++ build warns that no CUDA runtime is found, on a CPU.
    """
    loggers = [logging.getLogger(n) for n in ("torch.utils._pytree", "torch.utils.cpp_extension")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def prunable(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every Conv2d and Linear: the layers whose weights pruning counts."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]


@dataclass(frozen=True)
class Sparsity:
    """Zeros in the stored weights of the Conv2d and Linear layers."""

    zeros: int
    total: int
    masks_left: tuple[str, ...]  # layers still reparametrised (weight_orig and weight_mask)

    @property
    def fraction(self) -> float:
        return self.zeros / max(self.total, 1)


def sparsity(model: nn.Module) -> Sparsity:
    """Count the zeros in what the model stores and saves, not in its masks.

    A layer pruned and not yet made permanent stores ``weight_orig`` (dense) and ``weight_mask``;
    its state dict, what a saved model holds, has no zeros in ``weight_orig``. Those layers are
    counted from ``weight_orig`` and named in ``masks_left``.
    """
    zeros = total = 0
    left = []
    for name, m in prunable(model):
        stored = getattr(m, "weight_orig", None)
        if stored is None:
            stored = m.weight
        else:
            left.append(name)
        zeros += int((stored == 0).sum())
        total += stored.numel()
    return Sparsity(zeros, total, tuple(left))


def model_bytes(model: nn.Module) -> int:
    """Bytes of the tensors ``model`` needs to run, each storage counted once.

    For a module, its state dict (what ``torch.save(model.state_dict())`` writes). For a
    ``torch.fx.GraphModule`` (what ``convert_pt2e`` returns), the tensors its graph reads
    (``get_attr``): the converted module still carries the fp32 weights it was made from as
    attributes, which its graph no longer uses, and an int8 weight is 1 byte an element.
    """
    if isinstance(model, torch.fx.GraphModule):
        tensors = []
        for node in model.graph.nodes:
            if node.op == "get_attr":
                value = model
                for part in node.target.split("."):
                    value = getattr(value, part)
                if isinstance(value, torch.Tensor):
                    tensors.append(value)
    else:
        tensors = [t for t in model.state_dict().values() if isinstance(t, torch.Tensor)]
    storages = {}
    for t in tensors:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(storages.values())


def zipped_bytes(model: nn.Module) -> int:
    """Bytes of ``torch.save(model.state_dict())`` compressed with zlib: where 50% zeros shrink a
    file, though the dense tensors in memory stay the same size."""
    import zlib

    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return len(zlib.compress(buffer.getvalue(), 1))


@dataclass(frozen=True)
class ComputedWith:
    """What a model's forward read that existed before the call: the weights it computes with."""

    bytes: int  # of those tensors' storages, each counted once
    int8_elements: int  # of those that are int8


def computed_with(model, batch: torch.Tensor) -> ComputedWith:
    """The tensors one forward of ``model`` on ``batch`` reads that it did not make: its weights,
    as its operators see them.

    Read through a TorchDispatchMode, which sees every operator's tensor arguments, whatever holds
    them (parameters, buffers, plain attributes, a closure): a model that keeps int8 copies as
    attributes while an fp32 model does the computing reads fp32 weights here. The batch itself,
    and every tensor an operator of the forward returned, are not counted.
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    read, made = {}, {batch.untyped_storage().data_ptr()}

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            for t in tree_flatten((args, kwargs or {}))[0]:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    storage = t.untyped_storage()
                    read.setdefault(storage.data_ptr(), (storage.nbytes(), t.dtype, storage.nbytes() // t.element_size()))
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    made.add(t.untyped_storage().data_ptr())
            return out

    with quiet(), torch.no_grad(), Reads():
        model(batch)
    weights = [v for ptr, v in read.items() if ptr not in made and ptr != 0]
    return ComputedWith(sum(n for n, _, _ in weights), sum(k for _, dtype, k in weights if dtype == torch.int8))


def int8_elements(model: nn.Module) -> int:
    """Elements of the int8 tensors ``model`` holds (its quantised weights), in attributes and parameters."""
    seen, count = set(), 0
    for module in model.modules():
        tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)) + \
            [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
        for t in tensors:
            if t.dtype == torch.int8 and id(t) not in seen:
                seen.add(id(t))
                count += t.numel()
    return count


def latency(model: nn.Module, batch: torch.Tensor, *, calls: int, warmup: int = 5) -> measure.StepTimes:
    """Per-request latency of ``model`` on ``batch`` (CPU, no_grad), over ``calls`` timed calls."""
    with quiet(), torch.no_grad():
        return measure.time_steps(lambda: model(batch), CPU, warmup=warmup, steps=calls,
                                  samples_per_step=len(batch))


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy in batches of :data:`SERVE_BATCH`, the last one padded: an exported int8
    model takes the batch size it was exported with, and nothing else."""
    correct = 0
    with quiet():
        for x, y in zip(images.split(SERVE_BATCH), labels.split(SERVE_BATCH)):
            n = len(x)
            if n < SERVE_BATCH:
                x = torch.cat([x, x.new_zeros(SERVE_BATCH - n, *x.shape[1:])])
            correct += int((model(x)[:n].argmax(1) == y).sum())
    return correct / max(len(labels), 1)
