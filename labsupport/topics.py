"""Short measured topics beside the graded work: each helper runs one small experiment and returns
its numbers as a table, on any device (a GPU-only tool says so where there is no GPU).

- 01: per-layer forward time with module hooks (:func:`layer_times`); bytes moved against FLOPs
  for a copy, an elementwise add and a matmul (:func:`bandwidth`); the Nsight command lines.
- 02: many small files against one packed file, warm and cold (:func:`small_files_vs_packed`);
  threads, core affinity and visible devices (:func:`thread_scaling`, :func:`child_view`).
- 04: the memory of training, worked out from the parameter count and checked against a count of
  tensor bytes (:func:`measured_training_bytes`; the arithmetic is the student's, graded in 04).
- 05: export, run and compare (:func:`exported_and_compared`); which attention kernel
  ``F.scaled_dot_product_attention`` ran (:func:`attention_kernels`).

Every experiment is sized to take a few seconds on two CPU cores.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from .measure import micro, sync
from .memory import TensorBytes

# --- 01: per-layer time with hooks -------------------------------------------------------------


def layer_times(model: nn.Module, x: torch.Tensor, *, repeats: int = 3) -> pd.DataFrame:
    """Forward milliseconds of each of ``model``'s direct children, timed by a forward pre-hook
    (clock starts) and a forward hook (clock stops) on each; median of ``repeats`` forwards after
    one warm-up. On CUDA the hooks record CUDA events, elsewhere they read ``perf_counter``
    (notebook 01)."""
    cuda = x.device.type == "cuda"
    starts: dict[str, object] = {}
    times: dict[str, list[float]] = {}
    pending: list[tuple[str, object, object]] = []

    def before(name):
        def hook(module, args):
            if cuda:
                starts[name] = torch.cuda.Event(enable_timing=True)
                starts[name].record()
            else:
                starts[name] = time.perf_counter()
        return hook

    def after(name):
        def hook(module, args, output):
            if cuda:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                pending.append((name, starts[name], end))
            else:
                times.setdefault(name, []).append((time.perf_counter() - starts[name]) * 1000)
        return hook

    handles = []
    for name, child in model.named_children():
        handles += [child.register_forward_pre_hook(before(name)), child.register_forward_hook(after(name))]
    try:
        with torch.no_grad():
            model(x)  # warm-up, not recorded below
            times.clear(), pending.clear()
            whole = []
            for _ in range(repeats):
                sync(x.device)
                t0 = time.perf_counter()
                model(x)
                sync(x.device)
                whole.append((time.perf_counter() - t0) * 1000)
    finally:
        for handle in handles:  # a hook left behind would time every later forward
            handle.remove()
    for name, start, end in pending:
        times.setdefault(name, []).append(start.elapsed_time(end))
    frame = pd.DataFrame({"ms": {name: float(np.median(t)) for name, t in times.items()}})
    frame["share"] = frame["ms"] / frame["ms"].sum()
    frame.attrs["forward_ms"] = float(np.median(whole))
    return frame


# --- 01: bytes moved against FLOPs -------------------------------------------------------------

# Elements per operand: more than a CPU's last-level cache (a 32 MiB L3 per Zen 4 CCD) or an H100's
# 50 MiB L2, so that a copy is timed against main memory, not a cache.
BANDWIDTH_ELEMENTS = {"cuda": 2**26, "cpu": 2**24, "mps": 2**24}


def bandwidth(device: torch.device | str, *, matmul_n: int | None = None, min_run_time_s: float = 0.2) -> pd.DataFrame:
    """Bytes moved, FLOPs and measured time of a copy, an elementwise add and a float32 matmul on
    ``device``, each read as GB/s and GFLOP/s; the copy's GB/s is the bandwidth the other two are
    set against (notebook 01)."""
    device = torch.device(device)
    n = BANDWIDTH_ELEMENTS.get(device.type, 2**24)
    m = matmul_n or (4096 if device.type == "cuda" else 1024)
    a, b = torch.rand(n, device=device), torch.rand(n, device=device)
    out = torch.empty_like(a)
    x, y = torch.rand(m, m, device=device), torch.rand(m, m, device=device)
    four = 4  # bytes per float32
    cases = {  # name: (call, bytes read + written, FLOPs)
        "copy (out.copy_(a))": (lambda: out.copy_(a), 2 * n * four, 0),
        "elementwise add (a + b)": (lambda: torch.add(a, b, out=out), 3 * n * four, n),
        f"matmul {m}x{m} (x @ y)": (lambda: torch.mm(x, y), 3 * m * m * four, 2 * m ** 3),
    }
    rows = {}
    for name, (call, nbytes, flops) in cases.items():
        seconds = micro(call, name, min_run_time_s=min_run_time_s).median
        rows[name] = {"MB moved": nbytes / 1e6, "MFLOP": flops / 1e6, "FLOP per byte": flops / nbytes,
                      "ms": seconds * 1e3, "GB/s": nbytes / seconds / 1e9, "GFLOP/s": flops / seconds / 1e9}
    frame = pd.DataFrame(rows).T
    copy_gb_s = frame["GB/s"].iloc[0]
    # How long the op would take if moving its bytes at the copy's speed were all it did.
    frame["ms at copy bandwidth"] = frame["MB moved"] / 1e3 / copy_gb_s * 1e3
    frame.attrs["copy_gb_s"] = float(copy_gb_s)
    return frame


# Nsight's command lines (NVIDIA GPUs only). nsys records a timeline of the whole process (CPU
# threads, CUDA API calls, kernels, copies and the NVTX ranges); ncu replays chosen kernels and
# reads their hardware counters (memory throughput, achieved occupancy, the roofline).
NSYS_COMMAND = "nsys profile --trace=cuda,nvtx,osrt -o 01-nsys python train.py"
NSYS_STATS_COMMAND = "nsys stats --report nvtx_sum,cuda_gpu_kern_sum 01-nsys.nsys-rep"
NCU_COMMAND = ("ncu --nvtx --nvtx-include 'forward/' --set full --launch-count 5 "
               "-o 01-ncu python train.py")


# --- 02: small files against one packed file -----------------------------------------------------


def _drop_from_page_cache(path: Path) -> bool:
    """Ask the kernel to forget ``path``'s cached pages (Linux posix_fadvise); False where it cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages are not dropped: write them out first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def small_files_vs_packed(count: int = 2000, shape: tuple[int, ...] = (3, 32, 32), *,
                          folder: Path | str | None = None) -> pd.DataFrame:
    """Read ``count`` uint8 arrays of ``shape`` from one ``.npy`` file each, and the same arrays from
    one packed ``.npy`` (a memmap), twice each: cold (the files' pages dropped from the OS page
    cache first, where Linux allows it) and warm (read again at once). Files/s and MB/s (notebook 02)."""
    rng = np.random.default_rng(0)
    arrays = rng.integers(0, 256, size=(count, *shape), dtype=np.uint8)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        root = Path(tmp)
        paths = [root / f"{i:06d}.npy" for i in range(count)]
        for path, array in zip(paths, arrays):
            np.save(path, array)
        packed = root / "packed.npy"
        np.save(packed, arrays)

        def read_files():
            return [np.load(path) for path in paths]

        def read_packed():
            table = np.load(packed, mmap_mode="r")  # one open; each row a slice of the mapping
            return [np.array(table[i]) for i in range(count)]

        rows = {}
        for name, read, files in (("one file per sample", read_files, paths),
                                  ("one packed file (memmap)", read_packed, [packed])):
            for state in ("cold", "warm"):
                if state == "cold" and not all(_drop_from_page_cache(p) for p in files):
                    continue
                t0 = time.perf_counter()
                got = read()
                seconds = time.perf_counter() - t0
                assert np.array_equal(got[-1], arrays[-1])
                rows[(name, state)] = {"samples/s": count / seconds, "MB/s": arrays.nbytes / seconds / 1e6,
                                       "ms": seconds * 1e3, "files opened": len(files)}
    return pd.DataFrame(rows).T.rename_axis(["layout", "page cache"])


# --- 02: threads and cores ---------------------------------------------------------------------


def _pin_every_thread(cores: list[int]) -> None:
    """Allow this process's threads only ``cores``. Linux's affinity is per thread: ``sched_setaffinity(0)``
    moves only the calling one, not torch's running OpenMP workers (as ``taskset -p`` without ``-a``)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass


def thread_scaling(n: int = 512, *, min_run_time_s: float = 0.2) -> pd.DataFrame:
    """An ``n x n`` float32 matmul timed with 1 thread and with one per allowed core, then (Linux)
    with as many threads on one core only (``os.sched_setaffinity``); this process's threads and
    affinity are restored after (notebook 02)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    threads_before = torch.get_num_threads()
    a, b = torch.rand(n, n), torch.rand(n, n)
    rows = {}

    def run(label, threads, on):
        torch.set_num_threads(threads)
        ms = micro(lambda: torch.mm(a, b), label, min_run_time_s=min_run_time_s).median * 1e3
        rows[label] = {"threads": threads, "cores allowed": on, "ms": ms, "GFLOP/s": 2 * n ** 3 / ms / 1e6}

    try:
        run("1 thread", 1, len(cores))
        run(f"{len(cores)} threads", len(cores), len(cores))
        if hasattr(os, "sched_setaffinity") and len(cores) > 1 and Path("/proc/self/task").is_dir():
            _pin_every_thread(cores[:1])
            try:
                run(f"{len(cores)} threads pinned to core {cores[0]}", len(cores), 1)
            finally:
                _pin_every_thread(cores)
    finally:
        torch.set_num_threads(threads_before)
    frame = pd.DataFrame(rows).T
    frame["speedup vs 1 thread"] = frame["ms"].iloc[0] / frame["ms"]
    return frame


_CHILD = ("import os, torch; print(sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?', "
          "torch.get_num_threads(), torch.cuda.device_count(), sep='|')")


def child_view(env: dict[str, str] | None = None, cores: str | None = None) -> dict[str, str]:
    """What a new Python process started with ``env`` added (``CUDA_VISIBLE_DEVICES``, ``OMP_NUM_THREADS``)
    and, where ``taskset`` exists, on ``cores`` ("0") sees: its allowed cores, torch's threads and
    the CUDA devices it can use (notebook 02)."""
    command = [sys.executable, "-c", _CHILD]
    if cores is not None and shutil.which("taskset"):
        command = ["taskset", "-c", cores, *command]
    done = subprocess.run(command, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"the child process failed: {done.stderr.strip()[-500:]}")
    allowed, threads, gpus = done.stdout.strip().splitlines()[-1].split("|")
    return {"command": " ".join(f"{k}={v}" for k, v in (env or {}).items()) + (" taskset -c " + cores if "taskset" in command else "")
            + " python", "allowed cores": allowed, "torch threads": threads, "CUDA devices": gpus}


# --- 04: the memory of training -------------------------------------------------------------------

def measured_training_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, int]:
    """One Adam step of ``model`` on ``(x, y)`` from no state, counted by ``ls.memory.TensorBytes``:
    the weights (before the step), what the step leaves behind (gradients and Adam's two buffers
    per parameter) and its peak above the weights (notebook 04)."""
    optimizer = torch.optim.Adam(model.parameters(), foreach=False)  # foreach: temporaries per group
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    with TensorBytes(x.device.type) as counter:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        del loss
        sync(x.device)
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0)  # Adam's step counts are 0-d: not counted
    return {"weights": weights, "gradients + state (retained)": counter.live_bytes,
            "of which optimizer state": state, "peak above weights": counter.peak_bytes}


# --- 05: export, run, compare ------------------------------------------------------------------


def exported_and_compared(model: nn.Module, x: torch.Tensor, *, min_run_time_s: float = 0.2) -> pd.DataFrame:
    """``model`` exported with ``torch.export`` (saved and loaded back from bytes) and traced to
    TorchScript (``torch.jit.trace``, deprecated), each run on ``x`` and compared with eager: the
    largest difference, the file's size and the time of a call (notebook 05)."""
    model = model.eval()
    with torch.no_grad():
        expected = model(x)
    rows = {"eager": {"max |difference|": 0.0, "saved MB": None,
                      "ms": micro(lambda: model(x), "eager", min_run_time_s=min_run_time_s).median * 1e3}}

    def row(name, run, nbytes):
        with torch.no_grad():
            got = run(x)
            ms = micro(lambda: run(x), name, min_run_time_s=min_run_time_s).median * 1e3
        rows[name] = {"max |difference|": float((got - expected).abs().max()), "saved MB": nbytes / 1e6, "ms": ms}

    buffer = io.BytesIO()
    torch.export.save(torch.export.export(model, (x,)), buffer)
    loaded = torch.export.load(io.BytesIO(buffer.getvalue())).module()
    row("torch.export (saved, loaded)", loaded, len(buffer.getvalue()))
    with warnings.catch_warnings():  # torch.jit.trace warns that it is deprecated: said in the notebook
        warnings.simplefilter("ignore", FutureWarning)
        with torch.no_grad():
            traced = torch.jit.trace(model, x)
        buffer = io.BytesIO()
        torch.jit.save(traced, buffer)
        scripted = torch.jit.load(io.BytesIO(buffer.getvalue()))
        row("torch.jit.trace (saved, loaded)", scripted, len(buffer.getvalue()))
    return pd.DataFrame(rows).T


def onnx_problem() -> str | None:
    """Why ``torch.onnx.export`` cannot run here (its packages missing), or None."""
    import importlib.util

    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    return f"not installed here: {', '.join(missing)} (pip install onnx onnxscript)" if missing else None


# --- 05: which attention kernel ------------------------------------------------------------------


def attention_kernels(attention: Callable[[], object], device: torch.device | str) -> list[str]:
    """The ``aten::_scaled_dot_product_*`` / ``aten::_*attention*`` operators that one call of
    ``attention`` ran, read from the profiler: the backend SDPA chose (notebook 05)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])
    with profile(activities=activities) as prof:
        attention()
        sync(device)
    return sorted({e.key for e in prof.key_averages() if e.key.startswith("aten::_") and "attention" in e.key})


def sdpa_backends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, min_run_time_s: float = 0.2) -> pd.DataFrame:
    """``F.scaled_dot_product_attention(q, k, v)`` with each backend allowed alone
    (``torch.nn.attention.sdpa_kernel``): its time and the kernel it ran, or why it cannot run on
    these inputs and this device (notebook 05)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
        with sdpa_kernel([backend]):
            def call():
                return nn.functional.scaled_dot_product_attention(q, k, v)
            try:
                call()
            except RuntimeError as err:  # "No available kernel": the backend does not take these inputs here
                rows[backend.name] = {"ms": None, "kernel": f"cannot run: {str(err).splitlines()[0][:80]}"}
                continue
            ms = micro(call, backend.name, min_run_time_s=min_run_time_s).median * 1e3
            rows[backend.name] = {"ms": ms, "kernel": ", ".join(attention_kernels(call, q.device)) or "(math: matmuls)"}
    return pd.DataFrame(rows).T
