"""Data-parallel training on one machine: DDP over gloo, one process per worker.

:func:`run` starts ``world_size`` processes (``torch.multiprocessing.spawn``), joins them into a
gloo process group on this machine, and runs a list of :class:`Task` in each: a few steps of
ResNet-18 on each rank's shard of the same global batch, timed, with the first step's gradients
kept where a task asks. One start serves many tasks, because starting a process that imports
torch costs seconds.

What each rank does is what DDP does on a multi-GPU node: the same initial weights everywhere
(DDP broadcasts rank 0's), a forward and backward on its own shard, gradients averaged across
ranks by all-reduce in buckets during backward, and the same optimizer step everywhere. With
micro-batches, the accumulation is the student's own ``accumulate_step`` from notebook 04, run
on a network that puts every micro-batch's forward but the last under ``no_sync`` (DDP decides
in the forward whether the backward after it all-reduces), so only the last one all-reduces.
On a GPU node the backend is NCCL and each process owns one GPU; here the processes share the
CPU's cores and memory bandwidth, so what is measured here is how DDP behaves on this machine,
not a forecast for a GPU node.
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Task:
    """One measurement in every rank of a :func:`run`."""

    name: str
    # "resnet18"; "group_norm": per-sample normalisation, so shards add up exactly; "allreduce":
    # no model, only the all-reduce of a tensor as large as ResNet-18's gradients (communication alone)
    model: str = "resnet18"
    samples: int | None = None  # train on the first `samples` of each rank's shard (default: all of it)
    micro_batches: int = 1  # > 1: per rank and step, through your accumulate_step from 04
    no_sync: bool = True  # skip the all-reduce of every micro-batch but the last (DDP.no_sync)
    steps: int = 3  # timed optimizer steps
    warmup: int = 1  # steps run first and not timed
    keep_grads: bool = False  # keep the first step's averaged gradients (before the optimizer uses them)


@dataclass
class TaskResult:
    """What rank 0 measured for one task."""

    name: str
    world_size: int
    threads: int  # torch threads per process
    samples_per_step: int  # samples per optimizer step, all ranks together
    step_ms: list[float]  # each timed step, wall clock, every rank done
    allreduces_per_step: float  # gradient buckets all-reduced per optimizer step (0 for one process)
    grads: list[torch.Tensor] | None = field(default=None, repr=False)

    @property
    def median_ms(self) -> float:
        return float(np.median(self.step_ms))

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_step / (self.median_ms / 1000)


def _model(kind: str, seed: int) -> torch.nn.Module:
    from . import train

    if kind == "group_norm":
        return train.group_norm_resnet(seed)
    if kind == "resnet18":
        return train.build_model(seed=seed)
    raise ValueError(f"Task.model={kind!r}: use 'resnet18' or 'group_norm'.")


class _SyncOnLast(torch.nn.Module):
    """A DDP network for an accumulation loop: the forward of every micro-batch but a step's last
    runs under ``no_sync``, so only the last backward all-reduces the accumulated gradients."""

    def __init__(self, net: torch.nn.Module, micro_batches: int, no_sync: bool):
        super().__init__()
        self.net, self.micro_batches, self.no_sync, self.calls = net, micro_batches, no_sync, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = self.calls % self.micro_batches == self.micro_batches - 1
        self.calls += 1
        skip = self.no_sync and not last and hasattr(self.net, "no_sync")
        with self.net.no_sync() if skip else contextlib.nullcontext():
            return self.net(x)


def _worker(rank: int, world_size: int, threads: int, port: int, tasks: list[Task],
            images: torch.Tensor, labels: torch.Tensor, out: str, seed: int, code_dir: str) -> None:
    """One rank: join the group, run every task on this rank's shard, rank 0 writes the results."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from . import carry, measure

    accumulate_step = None
    if any(t.micro_batches > 1 for t in tasks):  # the student's own, as 04's checks measured it
        accumulate_step = carry.load("04", directory=Path(code_dir)).accumulate_step

    torch.set_num_threads(threads)
    if world_size > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size)
    shard_x, shard_y = images.chunk(world_size)[rank], labels.chunk(world_size)[rank]
    found = {}
    try:
        for task in tasks:
            if task.model == "allreduce":
                found[task.name] = _time_allreduce(task, world_size)
                continue
            model = _model(task.model, seed)
            buckets = [0]
            if world_size > 1:
                net = DistributedDataParallel(model)

                def counted(state, bucket):  # DDP's own all-reduce, counted
                    buckets[0] += 1
                    tensor = bucket.buffer().div_(world_size)
                    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])
                net.register_comm_hook(None, counted)
            else:
                net = model
            optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
            x_all, y_all = shard_x[:task.samples], shard_y[:task.samples]
            accumulating = _SyncOnLast(net, task.micro_batches, task.no_sync)
            times, grads = [], None
            for i in range(task.warmup + task.steps):
                if world_size > 1:
                    dist.barrier()  # every rank starts the step together
                buckets[0] = 0 if i == task.warmup else buckets[0]
                start = measure._clock()
                if task.micro_batches > 1:
                    accumulate_step(accumulating, optimizer, x_all, y_all, task.micro_batches)
                else:
                    optimizer.zero_grad()
                    F.cross_entropy(net(x_all), y_all).backward()
                if task.keep_grads and grads is None:
                    grads = [p.grad.detach().clone() for p in model.parameters()]
                optimizer.step()
                if world_size > 1:
                    dist.barrier()  # the step ends when the slowest rank is done
                if i >= task.warmup:
                    times.append((measure._clock() - start) * 1000)
            found[task.name] = {"step_ms": times, "allreduces_per_step": buckets[0] / task.steps, "grads": grads}
    finally:
        if world_size > 1:
            dist.destroy_process_group()
    if rank == 0:
        torch.save(found, Path(out) / "found.pt")


def _time_allreduce(task: Task, world_size: int) -> dict:
    """Time the all-reduce of one float32 tensor the size of ResNet-18's gradients, alone."""
    import torch.distributed as dist

    from . import measure

    grads = torch.ones(sum(p.numel() for p in _model("resnet18", 0).parameters()))
    times = []
    for i in range(task.warmup + task.steps):
        if world_size > 1:
            dist.barrier()
        start = measure._clock()
        if world_size > 1:
            dist.all_reduce(grads)
        if i >= task.warmup:
            times.append((measure._clock() - start) * 1000)
    return {"step_ms": times, "allreduces_per_step": 1.0 if world_size > 1 else 0.0, "grads": None}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world_size: int, tasks: list[Task], images: torch.Tensor, labels: torch.Tensor, *,
        threads: int = 1, seed: int = 0) -> dict[str, TaskResult]:
    """Run ``tasks`` in ``world_size`` processes of ``threads`` torch threads each.

    ``images`` and ``labels`` are one global batch on the CPU, split evenly across the ranks and
    reused at every step. A task with micro-batches runs your ``accumulate_step`` from notebook 04
    (a :class:`~labsupport.carry.CarryError` says to run 04 first). Returns ``{task name:
    TaskResult}`` as rank 0 measured it.
    """
    import torch.multiprocessing as mp

    from . import carry

    if any(t.micro_batches > 1 for t in tasks):
        carry.load("04")  # here, so that a missing 04 is one clear error, not one per process

    if len(images) % world_size:
        raise ValueError(f"a global batch of {len(images)} does not split evenly across {world_size} processes")
    with tempfile.TemporaryDirectory(prefix="lab-ddp-") as out:
        mp.spawn(_worker, args=(world_size, threads, _free_port(), list(tasks), images, labels, out, seed,
                                str(carry.code_dir())), nprocs=world_size, join=True)
        found = torch.load(Path(out) / "found.pt")
    per_rank = len(images) // world_size
    samples = {t.name: world_size * min(per_rank, t.samples or per_rank) for t in tasks}
    return {name: TaskResult(name, world_size, threads, samples[name], r["step_ms"], r["allreduces_per_step"],
                             r["grads"]) for name, r in found.items()}


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest absolute difference between two lists of gradients."""
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))
