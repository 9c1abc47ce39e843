"""How close a rung's step runs to the machine: a peak that bounds it, and the best kernels measured.

Two figures per device and dtype, both shown (design brief, point 10):

- the **theoretical peak** (:func:`theoretical`): cores x clock x FLOPs per cycle on a CPU, SMs x
  clock x FLOPs per SM and cycle on a GPU. Nothing measured can exceed it, so "% of peak" is read
  against it; where a figure cannot be known here (a VM that hides its clock, an unknown core),
  it says so and no percentage is printed;
- the **best measured kernel** of the kind the step runs (:func:`kernels`): a dense matmul at
  several sizes, and the step's own 3x3 convolutions (ResNet-18's first and third stages at the
  rung's image size and batch) in NCHW and channels_last, timed through the lab's one micro-timing
  path (:func:`labsupport.measure.micro`).

:func:`peaks` measures the kernels once per run and keeps them in the results store
(``roofline/peaks.json``), so ``make run``'s printed table and the HTML report read the same
value; :func:`table` reads each rung against both. 06's report (:func:`labsupport.report.export_html`)
and ``make run``'s closing table use them.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

# FLOPs one core can do per cycle, counted as the FLOP counter counts a step (2 per multiply-add), so
# only the units that multiply count: AMD's separate FP add pipes add no multiply-add.
# - Intel AVX-512 server cores: two 512-bit FMA units (Xeon Gold 6xxx and Platinum; some cheaper
#   parts have one: the bound takes two), 2 x 16 x 2 = 64 fp32. VDPBF16PS does 32 bf16 products
#   into 16 fp32 lanes on the same ports: 128 bf16. AMX: 1024 bf16 FLOPs per cycle and core
#   (Intel, "Accelerate AI Workloads with Intel AMX", Sapphire Rapids: 2048 int8 / 1024 bf16 ops).
# - AMD Zen 2-4: two 256-bit FMA pipes (FP0, FP1; FP2/FP3 only add), and Zen 4 runs a 512-bit op on
#   both halves of the pair: 2 x 8 x 2 = 32 fp32 (AMD's Software Optimization Guide for family 19h,
#   57647, section 2.11.1, as LLVM's X86ScheduleZnver4.td models it; Stack Overflow 15655835,
#   "FLOPs per cycle", Zen 4: 32 fp32 FMA FLOPs, 48 counting the add pipes). VDPBF16PS issues on
#   the FMA pipes with two bf16 products per fp32 lane: 64 bf16 (AMD publishes no separate rate).
# - AMD Zen 5 (family 26): 512-bit FMA pipes in its server and desktop parts: 64 fp32, 128 bf16.
# - Other x86 with AVX2 and FMA: 32 fp32; AVX without FMA: 16 (an 8-wide multiply and add).
# bf16 on a core without bf16 units is emulated through fp32 FMAs: its bound is the fp32 one.


def _cpuinfo() -> dict:
    """Vendor, family, model, flags and the "cpu MHz" line of /proc/cpuinfo ({} off Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    field = lambda name: (re.search(rf"^{name}\s*:\s*(.*)$", text, re.M) or [None, ""])[1].strip()  # noqa: E731
    return {"vendor": field("vendor_id"), "family": int(field("cpu family") or -1),
            "model": int(field("model") or -1), "flags": set(field("flags").split()),
            "mhz": float(field("cpu MHz") or 0)}


def flops_per_cycle(info: dict, dtype: str, units: str) -> tuple[int | None, str]:
    """FLOPs one core does per cycle in ``dtype`` (matmul-type work), and why; None if unknown."""
    flags, vendor, family = info.get("flags", set()), info.get("vendor", ""), info.get("family", -1)
    if dtype == "bfloat16" and units == "amx":
        return 1024, "AMX bf16 tiles"
    if vendor == "AuthenticAMD" and family == 26:
        fp32, why = 64, "Zen 5: two 512-bit FMA pipes"
    elif vendor == "AuthenticAMD" and family in (23, 25) and "fma" in flags:
        fp32, why = 32, "Zen 2-4: two 256-bit FMA pipes" + (" (AVX-512 runs on both halves)" if "avx512f" in flags else "")
    elif "avx512f" in flags:
        fp32, why = 64, "AVX-512: two 512-bit FMA units (the most a core has)"
    elif "fma" in flags and "avx2" in flags:
        fp32, why = 32, "AVX2: two 256-bit FMA units"
    elif "avx" in flags:
        fp32, why = 16, "AVX: an 8-wide multiply and an 8-wide add"
    else:
        return None, "unknown core: no per-cycle figure for it"
    if dtype == "float32":
        return fp32, why
    if dtype == "bfloat16" and units == "avx512_bf16":
        return 2 * fp32, why + "; AVX-512 BF16's dot product: two bf16 products per fp32 lane"
    return fp32, why + f"; {dtype} is emulated through fp32 here"


# The highest max boost clock of any CPU of a family, for a machine that does not expose its own
# (a VM without cpufreq): a bound, not this CPU's clock. From the vendors' product pages:
# EPYC 9004 "Genoa" (family 25, model 0x10-0x1f; WikiChip: "Family 19h, Model 11h"): the 9174F's
# up to 4.4 GHz; EPYC 7003 "Milan" (family 25, model 0x00-0x0f): the 72F3's up to 4.1 GHz; Xeon
# "Sapphire Rapids" (family 6, model 143, Xeon W-3400 included): the w9-3495X's up to 4.8 GHz; any
# Zen 5 (family 26: EPYC 9005 "Turin", Ryzen 9000): the Ryzen 9 9950X's up to 5.7 GHz. A VM's model
# name ("AMD EPYC") hides which of these it is; its family and model do not.
FAMILY_MAX_GHZ = ((("AuthenticAMD", 25, range(0x10, 0x20)), 4.4, "EPYC 9004 (Genoa): the 9174F's max boost"),
                  (("AuthenticAMD", 26, range(0, 256)), 5.7, "Zen 5: the Ryzen 9 9950X's max boost"),
                  (("AuthenticAMD", 25, range(0x00, 0x10)), 4.1, "EPYC 7003 (Milan): the 72F3's max boost"),
                  (("GenuineIntel", 6, range(143, 144)), 4.8, "Sapphire Rapids: the w9-3495X's max turbo"))


def cpu_clock_ghz(info: dict, cpus: list[int] | None = None) -> tuple[float | None, str]:
    """The highest clock this machine's cores can run, in GHz, and where it came from; None if unknown.

    ``LAB_CPU_MAX_GHZ`` (from the CPU's datasheet), else sysfs' ``cpuinfo_max_freq`` (the most the
    kernel may ask for, boost included), else the fastest part of this CPU's family. /proc/cpuinfo's
    "cpu MHz" is never used as a bound: it is the current or, in a VM, the nominal clock, which
    boost exceeds (2.6 GHz on the lab's EPYC, whose convolutions run faster than that allows).
    """
    forced = os.environ.get("LAB_CPU_MAX_GHZ", "").strip()
    if forced:
        try:
            return float(forced), "LAB_CPU_MAX_GHZ"
        except ValueError:
            raise ValueError(f"LAB_CPU_MAX_GHZ={forced!r}: give the CPU's max boost clock in GHz, e.g. 3.7, "
                             "or unset it") from None
    cpus = cpus if cpus is not None else sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    found = []
    for cpu in cpus:
        try:
            found.append(int(Path(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq").read_text()))
        except (OSError, ValueError):
            pass
    if found:
        return max(found) / 1e6, "sysfs max frequency (cpuinfo_max_freq)"
    for (vendor, family, models), ghz, what in FAMILY_MAX_GHZ:
        if info.get("vendor") == vendor and info.get("family") == family and info.get("model") in models:
            return ghz, f"not exposed here (no cpufreq in sysfs); bound by the fastest {what}"
    mhz = info.get("mhz")
    return None, (f"not known: no cpufreq in sysfs, and /proc/cpuinfo's {mhz:.0f} MHz is the current or nominal "
                  "clock, which boost exceeds; set LAB_CPU_MAX_GHZ to the CPU's max boost clock" if mhz else
                  "not known: no cpufreq in sysfs; set LAB_CPU_MAX_GHZ to the CPU's max boost clock")


@dataclass(frozen=True)
class Bound:
    """A theoretical peak: FLOP/s (None where it cannot be known here) and how it was made."""

    flops_per_s: float | None
    how: str


def theoretical(device: torch.device | str, dtype: str, *, cores: int | None = None,
                units: str | None = None, info: dict | None = None) -> Bound:
    """The theoretical peak of ``device`` in ``dtype`` (a name: "float32", "bfloat16", "float16")."""
    device = torch.device(device)
    if device.type == "cuda":
        return _gpu_bound(device, dtype)
    if device.type != "cpu":
        return Bound(None, f"not known for {device.type}: no published per-cycle rate the lab reads")
    from .hardware import cpu_bf16_units

    info = _cpuinfo() if info is None else info
    units = cpu_bf16_units(info.get("flags", set())) if units is None else units
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    per_cycle, why = flops_per_cycle(info, dtype, units)
    ghz, clock = cpu_clock_ghz(info)
    if per_cycle is None or ghz is None:
        return Bound(None, f"{why if per_cycle is None else clock}")
    return Bound(cores * ghz * 1e9 * per_cycle,
                 f"{cores} cores x {ghz:.2f} GHz ({clock}) x {per_cycle} FLOP/cycle ({why})")


def _gpu_bound(device: torch.device, dtype: str) -> Bound:
    """SMs x clock x the dense tensor-core rate per SM and cycle (hardware.tensor_tflops's table):
    fp16, and bf16 from Ampere on; float32 at TF32's (half the fp16 rate), a bound whether TF32 is
    on or not (the CUDA cores reach about an eighth of it)."""
    from .hardware import tensor_tflops

    props = torch.cuda.get_device_properties(device)
    capability = (props.major, props.minor)
    clock_khz = getattr(props, "clock_rate", None)
    if not clock_khz:
        return Bound(None, "not known: this torch does not report the GPU's clock")
    fp16 = tensor_tflops(capability, props.multi_processor_count, clock_khz) * 1e12
    how = f"{props.multi_processor_count} SMs x {clock_khz / 1e6:.2f} GHz (CUDA's peak clock) x tensor cores"
    if fp16 == 0:
        return Bound(None, f"not known: compute capability {props.major}.{props.minor} has no tensor cores")
    if dtype == "float16" or (dtype == "bfloat16" and props.major >= 8):
        return Bound(fp16, how + f" ({dtype}, dense)")
    if props.major >= 8:
        return Bound(fp16 / 2, how + " (TF32, dense: the most float32 work can reach)")
    # No TF32 (and no native bf16) before Ampere: half the fp16 rate still bounds the CUDA cores'
    # float32 (a T4's 8.1 TFLOPS against 32.5), loosely.
    return Bound(fp16 / 2, how + f" (half the fp16 rate: a loose bound for {dtype}, which runs on the CUDA cores here)")


def _conv_flops(batch: int, channels: int, size: int) -> int:
    """FLOPs of a 3x3, stride-1, padded convolution: 2 per multiply-add, as FlopCounterMode counts."""
    return 2 * batch * channels * size * size * channels * 9


MATMUL_SIZES = {"cpu": (512, 1024, 2048), "mps": (1024, 2048, 4096), "cuda": (2048, 4096, 8192)}


def kernels(device: torch.device | str, dtype: str, image_size: int, batch_size: int,
            *, min_run_time_s: float = 0.3) -> list[dict]:
    """GFLOP/s of the kernels a step runs, each timed alone (:func:`labsupport.measure.micro`):
    ``n x n`` matmuls, and the 3x3 convolutions of ResNet-18's first and third stages (64 channels at
    a quarter of ``image_size``, 256 at a sixteenth) on ``batch_size`` images, forward, in NCHW and
    channels_last."""
    from .measure import micro, sync

    device, dt = torch.device(device), getattr(torch, dtype)
    # torch.utils.benchmark synchronises CUDA only: on MPS each call waits for its kernel here.
    done = (lambda out: sync(device)) if device.type == "mps" else (lambda out: out)
    rows = []
    for n in MATMUL_SIZES.get(device.type, (1024,)):
        a, b = (torch.randn(n, n, device=device).to(dt) for _ in range(2))
        m = micro(lambda: done(torch.mm(a, b)), f"matmul {n}", min_run_time_s=min_run_time_s)
        rows.append({"kernel": f"matmul {n}x{n}", "GFLOP/s": 2 * n ** 3 / m.median / 1e9})
    for channels, size in ((64, max(image_size // 4, 1)), (256, max(image_size // 16, 1))):
        conv = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False).to(device, dt)
        x = torch.randn(batch_size, channels, size, size, device=device).to(dt)
        for layout, fmt in (("NCHW", torch.contiguous_format), ("channels_last", torch.channels_last)):
            c, xi = conv.to(memory_format=fmt), x.contiguous(memory_format=fmt)
            with torch.no_grad():
                m = micro(lambda: done(c(xi)), f"conv {channels}", min_run_time_s=min_run_time_s)
            rows.append({"kernel": f"3x3 conv {channels} ch {size}x{size} x{batch_size}, {layout}",
                         "GFLOP/s": _conv_flops(batch_size, channels, size) / m.median / 1e9})
    return rows


PEAKS_FILE = Path("roofline") / "peaks.json"


def peaks(device: torch.device | str, machine: dict, wanted: dict[str, tuple[int, int]],
          directory: Path | str | None = None) -> dict[str, dict]:
    """Per dtype: its theoretical peak and its measured kernels, ``{dtype: {"theoretical",
    "how", "kernels", "image_size", "batch_size"}}``, for ``wanted`` ``{dtype: (image_size,
    batch_size)}``.

    Measured once per run: kept in the results store (``roofline/peaks.json`` in ``directory``,
    default the lab's) with the machine, and reused by every later reader on the same machine
    (same cores and torch threads), so the printed table and the report show one value.
    """
    from .hardware import same_machine
    from .results import results_dir

    path = Path(directory or results_dir()) / PEAKS_FILE
    threads = torch.get_num_threads()
    # A VM names a Zen 4 and a Zen 5 EPYC alike ("AMD EPYC"), and same_machine compares names: the
    # core's family and model tell them apart (twice the FLOPs per cycle on Zen 5).
    core = {k: v for k, v in _cpuinfo().items() if k in ("vendor", "family", "model")}
    try:
        # The store may be a student's (an instructor's report of their run): a link or an outsized
        # file is not read, and the kept file is replaced, never written through.
        if path.is_symlink() or path.stat().st_size > 2**20:
            raise ValueError(f"{path}: not a plain, small file")
        kept = json.loads(path.read_text())
        entries = kept["entries"] if (isinstance(kept.get("entries"), dict) and kept.get("threads") == threads
                                      and kept.get("core") == core
                                      and same_machine(kept.get("machine") or {}, machine, cores=True)) else {}
    except (OSError, ValueError, AttributeError, TypeError):
        entries = {}
    changed = False
    for dtype, (size, batch) in wanted.items():
        entry = entries.get(dtype)
        if not (isinstance(entry, dict) and entry.get("image_size") == size and entry.get("batch_size") == batch
                and _plausible(entry)):
            bound = theoretical(device, dtype, cores=machine.get("cpu_cores"))
            entries[dtype] = {"theoretical": bound.flops_per_s, "how": bound.how, "image_size": size,
                              "batch_size": batch, "kernels": kernels(device, dtype, size, batch)}
            changed = True
    if changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"machine": machine, "threads": threads, "core": core, "entries": entries},
                                  indent=1))
        tmp.replace(path)
    return {dtype: entries[dtype] for dtype in wanted}


def _plausible(entry: dict) -> bool:
    """A kept entry of numbers the report can print (a store is a file anyone could have edited)."""
    number = lambda v: isinstance(v, (int, float)) and math.isfinite(v) and v > 0  # noqa: E731
    kernels_ = entry.get("kernels")
    return ((entry.get("theoretical") is None or number(entry.get("theoretical"))) and isinstance(entry.get("how"), str)
            and isinstance(kernels_, list) and bool(kernels_)
            and all(isinstance(k, dict) and isinstance(k.get("kernel"), str) and number(k.get("GFLOP/s")) for k in kernels_))


# Where a rung reads near or above a bound, what that means (printed under the table).
NEAR = 0.9


def reading(per_s: float, theoretical_: float | None, best: float) -> str:
    """What a rung's FLOP/s means against the theoretical peak and the best kernel measured."""
    if theoretical_ and per_s > theoretical_:
        return ("above the theoretical peak: impossible as counted, so the count is wrong (a convolution "
                "algorithm doing fewer multiplies than the count, e.g. Winograd) or the peak's clock is")
    if theoretical_ and per_s >= NEAR * theoretical_:
        return "near the theoretical peak: compute-bound; only cheaper arithmetic or less work pays"
    if per_s > best:
        return ("faster than every kernel measured alone: those ran slower than the step's own (a busier "
                "machine when they were timed, or shapes unlike the step's)")
    return ""


def table(lad, found: dict[str, dict]) -> pd.DataFrame:
    """Per rung of ``lad`` (a :class:`labsupport.report.Ladder`): FLOP/s counted on its step
    (:func:`labsupport.train.step_flops` x images/s), the theoretical peak and the best kernel
    measured in its dtype (``found``: :func:`peaks`), "% of peak" against the theoretical one."""
    from . import ladder, train

    rows, counted = [], {}
    for _, rec in lad.rows.iterrows():
        setup = lad.setups.get(rec["stage"], {})
        size, dtype = setup.get("image_size"), setup.get("amp_dtype") or "float32"
        per_s = rec.get("samples_per_s")
        if (dtype not in ladder.SETUP_DTYPES or type(size) is not int or size not in ladder.SETUP_SIZES
                or dtype not in found or per_s is None or pd.isna(per_s)):
            continue  # not a step the lab runs (ladder() drops such values from records already)
        per_image = counted.setdefault(size, train.step_flops(size))
        flops = per_image * float(per_s)
        entry = found[dtype]
        best = max(entry["kernels"], key=lambda k: k["GFLOP/s"])
        bound = entry["theoretical"]
        rows.append({"rung": dict(ladder.RUNGS).get(rec["stage"], rec["stage"]), "dtype": dtype,
                     "GFLOP per image": per_image / 1e9, "GFLOP/s": flops / 1e9,
                     "theoretical peak GFLOP/s": bound / 1e9 if bound else float("nan"),
                     "best kernel GFLOP/s": best["GFLOP/s"],
                     "% of peak": 100 * flops / bound if bound else float("nan"),
                     "reading": reading(flops, bound, best["GFLOP/s"] * 1e9)})
    return pd.DataFrame(rows).set_index("rung") if rows else pd.DataFrame()


def wanted(lad) -> dict[str, tuple[int, int]]:
    """``{dtype: (image_size, batch)}`` of the first rung of ``lad`` in each dtype: the shapes whose
    kernels :func:`peaks` measures."""
    from . import ladder

    out = {}
    for _, rec in lad.rows.iterrows():
        setup = lad.setups.get(rec["stage"], {})
        size, dtype = setup.get("image_size"), setup.get("amp_dtype") or "float32"
        batch = rec.get("batch")
        if (dtype in ladder.SETUP_DTYPES and type(size) is int and size in ladder.SETUP_SIZES
                and dtype not in out):
            out[dtype] = (size, int(batch) if isinstance(batch, (int, float)) and not pd.isna(batch) and 0 < batch <= 4096 else 32)
    return out


def kernels_frame(found: dict[str, dict]) -> pd.DataFrame:
    """Every kernel measured, per dtype, beside its theoretical peak (the report's second table)."""
    rows = [{"dtype": dtype, "kernel": k["kernel"], "GFLOP/s": k["GFLOP/s"],
             "% of peak": 100 * k["GFLOP/s"] * 1e9 / e["theoretical"] if e["theoretical"] else float("nan"),
             # A kernel above the bound is a fault of the bound (a clock or per-cycle figure wrong for
             # this machine) or of the measurement, never a machine beyond its limit: said, not hidden.
             "note": ("above the theoretical peak: the peak's clock or per-cycle figure, or this timing, is wrong"
                      if e["theoretical"] and k["GFLOP/s"] * 1e9 > e["theoretical"] else "")}
            for dtype, e in found.items() for k in e["kernels"]]
    return pd.DataFrame(rows)


NOTE = ("FLOPs of a training image counted on the step (matmuls and convolutions, 2 per multiply-add; "
        "not elementwise operators or data movement), times the rung's images/s. \"% of peak\" is against "
        "the theoretical peak, which nothing can exceed; the best kernel is the fastest of a dense matmul "
        "at several sizes and the step's own 3x3 convolutions in both layouts, each timed alone, once "
        "per run (kept in the results store, so the printed table and the report agree). A rung near the "
        "theoretical peak is compute-bound; one above it would mean a count to fix, or a convolution "
        "algorithm (Winograd) doing fewer multiplies than counted.")


def html_section(lad, found: dict[str, dict], as_table) -> list[str]:
    """06's report section: each rung against the peaks ``found`` (:func:`peaks`), how each
    theoretical peak was made, and every kernel measured; ``as_table(frame, css, **kw)`` renders."""
    import html

    rungs = table(lad, found)
    if rungs.empty:
        return []
    how = "".join(f"<li>{html.escape(d)}: {html.escape(e['how'])}</li>" for d, e in found.items())
    return ['<h2 id="roofline">How close to the machine\'s limit</h2>', f"<p>{html.escape(NOTE)}</p>",
            as_table(rungs, "roofline", float_format=lambda v: f"{v:,.1f}"),
            f"<p>Theoretical peaks:</p><ul>{how}</ul>",
            as_table(kernels_frame(found), "kernels", index=False, float_format=lambda v: f"{v:,.1f}")]
