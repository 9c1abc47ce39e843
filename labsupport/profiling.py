"""What the profiler and the device's own counters say about a step.

- :data:`PHASES`: the phases of a training step as the lab names them: what :mod:`labsupport.train`
  stamps (``PhaseClock``) and labels (``record_function``), and what a profile is read by;
- :func:`profiler`: a profile of a device's work, as ``torch.profiler.profile`` takes one;
- :func:`trace_phases`: a profiled step read per labelled phase (host time, device busy and idle,
  copies, kernels and the gaps between them);
- the GPU's utilisation counter (NVML, else ``nvidia-smi``), which ``ls.measure.utilisation`` samples.

Re-exported by :mod:`labsupport.measure` (``ls.measure.profiler``, ``ls.measure.trace_phases``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

PHASES = ("data wait", "host to device", "forward", "backward", "optimizer")


def profiler(device: torch.device | str, *, memory: bool = False, shapes: bool = False):
    """A profile of ``device``'s work as ``torch.profiler.profile`` takes one (the CPU's activity,
    and CUDA's on a GPU; ``memory``: the allocator's allocations and frees; ``shapes``: each
    operator's input shapes, ``record_shapes``), through the autograd
    profiler it wraps, for the checks' own profiles: its ``function_events`` are torch.profiler's
    ``events()``, its ``key_averages()`` the same table. torch.profiler's start asks
    ``hasattr(torch, "_inductor")``, which imports Inductor: about 2.5 s in a process that compiles
    nothing (a grading worker, class cpu), paid by every one that profiles."""
    use_device = "cuda" if torch.device(device).type == "cuda" else None
    return torch.autograd.profiler.profile(use_cpu=True, use_kineto=True, use_device=use_device,
                                           profile_memory=memory, record_shapes=shapes)


def _nvidia_smi_id(index: int) -> str:
    """How ``nvidia-smi -i`` names torch's CUDA device ``index``: by its UUID. nvidia-smi numbers
    the GPUs itself, ignoring CUDA_VISIBLE_DEVICES, so under ``CUDA_VISIBLE_DEVICES=3`` torch's
    device 0 is nvidia-smi's 3: by index it would read another GPU (another student's, on a
    shared grading node)."""
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # a torch without it: the index, right where nothing renumbers the GPUs
        return str(index)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def _gpu_sampler(device: torch.device) -> tuple[Callable[[], float], str]:
    """A function reading the GPU's utilisation now, and its source: NVML through
    ``torch.cuda.utilization`` (nvidia-ml-py), else one ``nvidia-smi --query-gpu`` per sample."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        torch.cuda.utilization(index)
        return (lambda: float(torch.cuda.utilization(index))), "torch.cuda.utilization (NVML)"
    except Exception:  # no nvidia-ml-py, or NVML unusable: ask nvidia-smi
        import subprocess

        command = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                   "-i", _nvidia_smi_id(index)]

        def read() -> float:
            return float(subprocess.run(command, capture_output=True, text=True, check=True, timeout=5).stdout)
        read()
        return read, "nvidia-smi --query-gpu=utilization.gpu"


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intervals (start, end) merged where they overlap, in order."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _clipped(intervals: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    return [(max(s, start), min(e, end)) for s, e in intervals if e > start and s < end]


def trace_phases(prof, phases: tuple[str, ...] | None = None) -> "pd.DataFrame":
    """Read a profiled step's trace per labelled phase, from the profiler's own events.

    ``prof`` is a finished ``torch.profiler.profile`` whose steps label their phases with
    ``record_function`` (default names: :data:`PHASES`, also ``train.PHASES``). Per phase, averaged over the profiled
    steps, in milliseconds: how long the host spent in it (``host ms``), how much of that time the
    device was working (``busy ms``) and idle (``idle ms``), the host-to-device copies that ran in
    it (``H2D copies``, their device time ``H2D ms``), how many device activities ran in it
    (``kernels``) and the median gap between one's end and the next one's start (``median gap
    us``: microseconds).

    On CUDA the device is the GPU: its kernels, copies and memsets, as the trace's device rows
    show them. The time is the host's: the GPU's work on a step's backward may run while the host
    is already in ``optimizer``. On a CPU the "device" is the operators themselves (every
    ``aten::`` op on any thread): idle is the time in a phase that no operator accounts for
    (Python, PIL decoding, waiting for a lock), and there are no host-to-device copies. The
    frame's ``attrs["device"]`` says which.
    """
    import pandas as pd
    from torch.autograd import DeviceType

    phases = tuple(phases or PHASES)
    events = list(prof.events())
    host = [e for e in events if e.device_type == DeviceType.CPU and e.name in phases]
    steps = max([sum(1 for e in host if e.name == phase) for phase in phases] + [1])
    on_device = [e for e in events if e.device_type != DeviceType.CPU
                 and e.name not in phases and not e.name.startswith("ProfilerStep#")]
    gpu = bool(on_device)
    if not gpu:  # a CPU: the operators are the device, each counted once (not the ops it calls)
        on_device = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")
                     and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]
    work = _merged([(e.time_range.start, e.time_range.end) for e in on_device])
    copies = [(e.time_range.start, e.time_range.end) for e in on_device if "HtoD" in e.name]
    rows = {}
    for phase in phases:
        windows = [(e.time_range.start, e.time_range.end) for e in host if e.name == phase]
        host_us = busy_us = copy_us = 0.0
        n_copies = n_kernels = 0
        gaps: list[float] = []
        for start, end in windows:
            inside = _clipped(work, start, end)
            host_us += end - start
            busy_us += sum(e - s for s, e in inside)
            gaps += [b[0] - a[1] for a, b in zip(inside, inside[1:])]
            mine = _clipped(copies, start, end)
            n_copies += len(mine)
            copy_us += sum(e - s for s, e in mine)
            n_kernels += sum(1 for e in on_device if start <= e.time_range.start < end)
        rows[phase] = {"host ms": host_us / 1e3 / steps, "busy ms": busy_us / 1e3 / steps,
                       "idle ms": (host_us - busy_us) / 1e3 / steps,
                       "H2D copies": n_copies / steps if gpu else float("nan"),
                       "H2D ms": copy_us / 1e3 / steps if gpu else float("nan"),
                       "kernels": n_kernels / steps,
                       "median gap us": float(np.median(gaps)) if gaps else float("nan")}
    frame = pd.DataFrame(rows).T
    frame.attrs["device"] = "GPU" if gpu else "CPU operators"
    return frame
