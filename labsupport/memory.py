"""Memory you can compare across devices: peak bytes of a training step, and saved activations.

- Peak bytes are counted the same way on every device, by :class:`TensorBytes`: a
  ``TorchDispatchMode`` sees every tensor an op creates, adds its storage's bytes, and subtracts
  them when the storage is freed (a ``weakref.finalize`` fires when the C++ storage dies, because
  torch preserves a storage's Python object while C++ still owns it). Only storages allocated
  inside the measured call count, and frees of tensors that existed before it (last step's
  gradients, which ``zero_grad(set_to_none=True)`` drops) are not subtracted.
- Why not the allocators' own counters for the graded figure: CUDA's ``max_memory_allocated`` minus the bytes
  allocated at the start *does* subtract those frees, so a step that first drops last step's
  gradients would peak lower on CUDA than on a CPU by the size of the gradients. A budget set as
  a multiple of one step's peak (04's) would then mean different things on different devices. On
  CPU the allocator keeps no counter; it reports each allocation and free to the profiler, which
  :func:`cpu_allocator_peak` sums (slow: a cross-check, not the figure). Process RSS mixes in the
  Python heap, library code and pages the OS has not reclaimed.
- On any device, :func:`saved_activation_bytes` counts the bytes autograd keeps for backward,
  through ``torch.autograd.graph.saved_tensors_hooks``: the number activation checkpointing and
  mixed precision shrink.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .measure import sync
from .profiling import profiler

# 04's memory budget: this many times the peak of the plain step at the profile's batch. The doubled
# batch, checkpointed, must fit under it.
BUDGET_FACTOR = 1.25


def _storage_ptrs(tree) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tree_flatten(tree)[0]
            if isinstance(t, torch.Tensor)}


class TensorBytes(TorchDispatchMode):
    """Count bytes of tensor storage created inside a ``with`` block, and their peak.

    Only storages *allocated* inside the block count: views, in-place results and tensors
    that existed before (parameters, a batch already loaded) do not. ``live_bytes`` is what is
    still allocated now, ``peak_bytes`` the most that was allocated at once.
    """

    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type
        self.live_bytes = 0
        self.peak_bytes = 0
        self._tracked: set[int] = set()  # id() of storages counted and not yet freed

    def _free(self, key: int, nbytes: int) -> None:
        self._tracked.discard(key)
        self.live_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = _storage_ptrs((args, kwargs))  # an output sharing one of these is an alias
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() in inputs or id(storage) in self._tracked:
                continue
            nbytes = storage.nbytes()
            self._tracked.add(id(storage))
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            weakref.finalize(storage, self._free, id(storage), nbytes)
        return out


@dataclass(frozen=True)
class MemoryReport:
    """Peak bytes of one call and bytes still held after it."""

    peak_bytes: int  # most bytes allocated at once during the call, above what it started with
    retained_bytes: int  # bytes the call allocated and did not free (e.g. optimizer state)
    method: str  # how the bytes were counted: "torch-dispatch" on every device
    # Beside the count, the allocator's own peak above where the call started. On CUDA the caching
    # allocator's (torch.cuda.max_memory_allocated: block rounding and cuDNN workspaces included,
    # which the count of tensor storages misses; what decides an out-of-memory error); on a CPU,
    # where asked for, c10's CPU allocator's, from every allocation and free it reported to the
    # profiler (:func:`cpu_allocator_peak`). None where not measured.
    allocator_peak_bytes: int | None = None


def peak_step_bytes(fn: Callable[[], object], device: torch.device, *, cpu_allocator: bool = False) -> MemoryReport:
    """Peak bytes torch allocates on ``device`` while ``fn()`` runs.

    Counted by :class:`TensorBytes` on every device, so a ratio or budget means the same thing on a
    GPU as on a CPU. Run one warm-up call first, so one-off allocations (optimizer state) are not
    in the peak. Not for a ``torch.compile``'d ``fn``: the counting mode sees ops, and compiled code
    runs fused kernels instead (the ladder shows no peak for 05's compiled rung). On CUDA the
    allocator's own peak comes beside the count; on a CPU too with ``cpu_allocator`` (the call
    then runs under the profiler: slower, so never for a timing).
    """
    device = torch.device(device)
    cuda = device.type == "cuda"
    if cuda:
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
    allocator = None
    with TensorBytes(device.type) as counter:
        if cpu_allocator and device.type == "cpu":
            allocator = cpu_allocator_peak(fn)()
        else:
            fn()
        sync(device)
    if cuda:
        allocator = torch.cuda.max_memory_allocated(device) - start
    return MemoryReport(counter.peak_bytes, counter.live_bytes, "torch-dispatch", allocator)


def cpu_allocator_peak(fn: Callable[[], object]) -> Callable[[], int | None]:
    """A call of ``fn()`` that returns the most bytes c10's CPU allocator held at once, in blocks
    allocated while it ran, or None where the profiler recorded none of them.

    Every CPU tensor's memory comes from that allocator, which reports each allocation and free
    (with its address) to the profiler when it records memory (``profile_memory=True``). Summed
    in order, as :class:`TensorBytes` counts storages (only blocks allocated inside the call;
    frees of earlier ones, last step's gradients, left out), they give the allocator's own figure,
    which sees tensors no dispatch mode was shown: a TorchDispatchMode can be switched off around
    an op, the allocator cannot.
    """
    def run() -> int | None:
        import json
        import os
        import tempfile

        _spend_the_unknown_block_warning()
        with profiler("cpu", memory=True) as prof:
            fn()
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f).get("traceEvents", [])
        finally:
            os.unlink(path)
        changes = sorted((float(e["ts"]), int(e["args"]["Addr"]), int(e["args"]["Bytes"])) for e in events
                         if isinstance(e, dict) and e.get("name") == "[memory]"
                         and e.get("args", {}).get("Device Type") == 0 and "Addr" in e["args"])
        if not changes:
            return None
        mine: dict[int, int] = {}  # address: bytes, of blocks allocated inside the call and not yet freed
        live = peak = 0
        for _, addr, nbytes in changes:
            if nbytes > 0:
                mine[addr] = mine.get(addr, 0) + nbytes
                live += nbytes
                peak = max(peak, live)
            elif addr in mine:
                live -= mine.pop(addr)
        return peak
    return run


_warned = []


def _spend_the_unknown_block_warning() -> None:
    """c10 warns once per process, on stderr, when a block allocated before a memory profile is
    freed during it ("Memory block of unknown size..."): true of every step that drops last step's
    gradients, and left out of the sums on purpose. Spend that one warning here, with stderr
    pointed at /dev/null, so no notebook or log shows it."""
    import os

    if _warned:
        return
    _warned.append(True)
    block = torch.empty(1024)
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        with profiler("cpu", memory=True):
            del block
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _is_parameter_cast(t: torch.Tensor) -> bool:
    """True for a dtype cast of a leaf tensor, e.g. the bf16 copy of a weight that autocast makes.

    Such copies scale with the parameter count, not with the batch: they are not activations.
    """
    fn = t.grad_fn
    return (fn is not None and type(fn).__name__.startswith("ToCopyBackward")
            and all(nxt is None or type(nxt).__name__ == "AccumulateGrad"
                    for nxt, _ in fn.next_functions))


def saved_activation_bytes(fn: Callable[[], object], model: torch.nn.Module | None = None) -> int:
    """Bytes of activations autograd saves for backward while ``fn()`` runs.

    Each storage counts once (a ReLU output that the next layer also saves is one tensor).
    Parameters, and the low-precision copies of them that autocast saves, do not count: they
    exist whatever the batch size. Call it on a forward pass only
    (``lambda: loss_fn(model(x), y)``), before backward frees the graph.
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()} if model else set()
    seen: set[tuple[str, int]] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if storage.data_ptr() not in params and key not in seen and not _is_parameter_cast(t):
            seen.add(key)
            total += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def forward_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """Bytes that ``fn()`` (a forward pass and loss) allocates and still holds when it returns.

    That is what the autograd graph keeps alive for backward, counted the same way whether or not
    the forward is checkpointed: checkpointing's own saved-tensor hooks hide the tensors inside a
    segment from :func:`saved_activation_bytes`, but not from the allocator.
    """
    device = torch.device(device)
    with TensorBytes(device.type) as counter:
        out = fn()
        sync(device)
    held = counter.live_bytes
    del out
    return held
