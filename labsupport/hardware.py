"""The machine the lab runs on: which device, what it can do, and how big each lesson should be.

Every result the lab records carries a :class:`Machine` description, and every notebook sizes its
work with the :class:`Profile` of the machine's *device class*, so that a lesson shows on a
laptop CPU, a Colab T4 and an A100 alike while each notebook stays inside its time budget.

Device classes:

=================  ==========================================================================
``cuda-tensorcore``  NVIDIA GPU with compute capability 7.0 or newer (tensor cores: 16-bit AMP pays; bf16 from Ampere on)
``cuda``             older NVIDIA GPU
``mps``              Apple silicon GPU
``cpu-bf16``         CPU with AMX or AVX-512 BF16 units (bf16 autocast pays when convolutions are big)
``cpu``              any other CPU
=================  ==========================================================================

A class's machines share its checks and bars; where one profile cannot fit them all, a family
has its own: the A100/H100 family of ``cuda-tensorcore`` runs ``cuda-tensorcore-xl``
(:func:`gpu_profile`).

Overrides (environment variables, read when called, never on import):

- ``LAB_DEVICE=cpu|cuda|mps`` forces the device.
- ``LAB_PROFILE=<name>[:field=value,...]`` picks another profile, e.g. ``LAB_PROFILE=tiny`` for
  tests or ``LAB_PROFILE=cpu-bf16:batch_size=16``. The tiny profile never grades speed.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch



@dataclass(frozen=True)
class Profile:
    """How much work one measurement does on a device class."""

    name: str  # the profile's name: a device class, a GPU family's ("cuda-tensorcore-xl"), or "tiny"
    image_size: int  # training resolution in px; the lab's JPEGs are larger, as ImageNet's are
    batch_size: int  # images per optimizer step
    warmup_steps: int  # steps run and discarded before timing (allocator, caches, autotuning)
    measure_steps: int  # steps timed for one throughput measurement
    rounds: int  # interleaved A/B rounds in a paired comparison
    steps_per_round: int  # steps each side runs in one round of a paired comparison
    train_steps: int  # steps of the short training run that checks accuracy parity
    grades_speed: bool = True  # False for profiles too small for a speedup to mean anything


# Why these sizes: on 2 cores of an Intel CPU with AMX (one of the 2-core machines the lab was
# measured on) a ResNet-18 step at 112 px, batch 32 takes about 0.9 s in fp32 and bf16 autocast is
# 1.8x faster there (1.7-2.0x with AMX or AVX-512 BF16), while at 32 px bf16 is *slower*
# (AMX needs enough work per convolution; design brief). GPU profiles use a larger batch so the
# GPU is busy enough that the naive input pipeline, not the model, becomes the bottleneck.
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("cuda-tensorcore", image_size=128, batch_size=128, warmup_steps=10,
                measure_steps=40, rounds=7, steps_per_round=10, train_steps=400),
        # The A100/H100 family of cuda-tensorcore (see gpu_profile): 6x the work per step, at the
        # JPEGs' own 160 px.
        Profile("cuda-tensorcore-xl", image_size=160, batch_size=512, warmup_steps=10,
                measure_steps=30, rounds=7, steps_per_round=6, train_steps=300),
        Profile("cuda", image_size=128, batch_size=64, warmup_steps=5,
                measure_steps=30, rounds=7, steps_per_round=6, train_steps=300),
        Profile("mps", image_size=112, batch_size=64, warmup_steps=5,
                measure_steps=20, rounds=5, steps_per_round=4, train_steps=200),
        Profile("cpu-bf16", image_size=112, batch_size=32, warmup_steps=2,
                measure_steps=8, rounds=5, steps_per_round=2, train_steps=120),
        Profile("cpu", image_size=64, batch_size=32, warmup_steps=2,
                measure_steps=8, rounds=5, steps_per_round=3, train_steps=150),
        Profile("tiny", image_size=32, batch_size=8, warmup_steps=1,
                measure_steps=3, rounds=3, steps_per_round=1, train_steps=20, grades_speed=False),
    )
}


@dataclass(frozen=True)
class DeviceClass:
    """What the lab decides once per device class.

    The 16-bit type, the GradScaler and whether to compile are not here: choosing them is what
    notebooks 03 and 05 teach, so the student's own choice (carried forward) decides them.
    """

    name: str  # the class's id, stored with every result and keyed in thresholds.toml
    what: str  # which machines fall in it
    profile: Profile  # how much work each measurement does there
    cell_timeout_s: int  # how long one notebook cell may run when graded there (nbgrader's limit)


# Cell limits (nbgrader's Execute.timeout when grading): the longest reference cell on 2 cores is
# 03's accuracy run, about 100 s on cpu-bf16 and of the same order on cpu (float32 there); about 5x
# headroom. MPS is slower. On a GPU the longest is one cold max-autotune compile of ResNet-18 (05
# compiles each mode in its own cell for this reason), estimated at a few minutes. A student who
# picks bf16 on class cpu, where it is emulated (about 9x slower), can exceed the limit and loses
# that cell.
# Every GPU profile, bar and cell limit is an ESTIMATE except what one H100 measured (2026-11-26,
# `make run` at cuda-tensorcore-xl, torch 2.11+cu130, 16 cores): 01 ran 294 s in its kernel (its
# longest cell 69 s, under the 600 s limit) and passed every check; the naive loader fed 440
# images/s (1.16 s per 512-image step), the reference loader 10,973 (162x), whose data wait was
# 13.8% of a step, above 02's 10% bar; 02's graded cells and 03-08 were not reached in the device
# time. At the tiny profile 01-04 ran there and passed their checks.
# One H200 measured every graded check of the reference once (2026-11-26, `python -m autograder
# accept --parts checks` at cuda-tensorcore-xl, torch 2.11+cu130, 16 cores; the table is in the
# README's "Acceptance" section): each cleared its class default except three that failed their
# correctness partner and 02's data wait (15.3% of a 61 ms step, bar 10%), all since fixed and
# measured again there: 04's accumulation (a floor measured on the device), 07's int8 (strict
# export: 0.251 of fp32's bytes, 1.34x against a 1.5x default on the machine's 16 CPU cores) and
# 02's loader (the decoded split kept on the GPU: a 6.8% wait). The checks' own times were up to
# 3 minutes per notebook; the notebooks' cells and grading there are still unmeasured.
CLASSES: dict[str, DeviceClass] = {
    c.name: c
    for c in (
        DeviceClass("cuda-tensorcore", "NVIDIA GPU, compute capability 7.0 or newer (tensor cores)",
                    PROFILES["cuda-tensorcore"], cell_timeout_s=600),
        DeviceClass("cuda", "older NVIDIA GPU", PROFILES["cuda"], cell_timeout_s=600),
        DeviceClass("mps", "Apple silicon GPU", PROFILES["mps"], cell_timeout_s=600),
        DeviceClass("cpu-bf16", "CPU with AMX or AVX-512 BF16 units", PROFILES["cpu-bf16"],
                    cell_timeout_s=600),
        DeviceClass("cpu", "any other CPU: emulated bf16 is 7-9x slower than float32 there",
                    PROFILES["cpu"], cell_timeout_s=900),
    )
}
DEVICE_CLASSES = tuple(CLASSES)


@dataclass(frozen=True)
class Machine:
    """What the lab ran on; stored with every result."""

    device: str  # torch device type the lab uses: "cuda", "mps" or "cpu"
    device_class: str  # one of DEVICE_CLASSES
    device_name: str  # GPU name, or the CPU model for CPU runs
    compute_capability: str | None  # "8.0" for an A100; None off CUDA
    cpu_model: str  # from /proc/cpuinfo or platform
    cpu_cores: int  # cores this process may use (affinity), not the host's total
    torch_threads: int  # torch.get_num_threads(): intra-op threads used for CPU work
    bf16: bool  # bf16 autocast is supported *and fast* on the device
    cpu_bf16_units: str  # "amx", "avx512_bf16" or "none"
    profile: str  # the scale profile this machine runs (its device class's, or its GPU family's)
    torch_version: str
    torchvision_version: str
    python_version: str
    platform: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def pick_device() -> torch.device:
    """CUDA, then MPS, then CPU, unless ``LAB_DEVICE`` says otherwise."""
    forced = os.environ.get("LAB_DEVICE", "").strip().lower()
    if forced:
        if forced not in ("cpu", "cuda", "mps"):
            raise ValueError(f"LAB_DEVICE={forced!r}: use one of cpu, cuda, mps, or unset it.")
        if forced == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("LAB_DEVICE=cuda but torch sees no CUDA GPU; unset LAB_DEVICE.")
        if forced == "mps" and not torch.backends.mps.is_available():
            raise RuntimeError("LAB_DEVICE=mps but MPS is not available; unset LAB_DEVICE.")
        return torch.device(forced)
    problem = gpu_problem()
    if problem:
        warnings.warn(problem, LabWarning, stacklevel=2)
    elif torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class LabWarning(UserWarning):
    """Something about this machine that changes what the lab measures."""


def _nvidia_gpu_present() -> bool:
    """True if the NVIDIA driver lists a GPU (Linux), whether or not torch can use it."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def _runs_on(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """True if a torch built for ``arch_list`` (``torch.cuda.get_arch_list()``) has kernels for a GPU
    of ``capability``: a cubin of the same major version and an equal or lower minor one, or PTX of
    an equal or lower version, which the driver compiles for it."""
    major, minor = capability
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        digits = "".join(ch for ch in number if ch.isdigit())  # sm_90a -> 90
        if not digits:
            continue
        have = (int(digits[:-1]), int(digits[-1]))
        if (kind == "sm" and have[0] == major and have[1] <= minor) or (kind == "compute" and have <= capability):
            return True
    return False


def gpu_problem() -> str | None:
    """Why an NVIDIA GPU on this machine is not used by torch, or None (no GPU, or a usable one).

    A GPU that torch cannot use is said, not silently replaced by a CPU class: a CPU-only torch
    build, a driver too old for the build's CUDA, or a GPU older than the build supports (the
    default CUDA 13 wheels start at compute capability 7.5).
    """
    if torch.cuda.is_available():
        capability = torch.cuda.get_device_capability(0)
        arch_list = torch.cuda.get_arch_list()
        if arch_list and not _runs_on(capability, arch_list):
            return (f"{torch.cuda.get_device_name(0)} (compute capability {capability[0]}.{capability[1]}) is older "
                    f"than this torch build supports ({' '.join(arch_list)}), so the lab runs on the CPU. To use "
                    "the GPU, install a torch build for it, e.g. pip install torch torchvision --index-url "
                    "https://download.pytorch.org/whl/cu126")
        return None
    if not _nvidia_gpu_present():
        return None
    if torch.version.cuda is None:
        why = f"this torch ({torch.__version__}) is a CPU-only build"
    else:
        why = (f"torch {torch.__version__} (built for CUDA {torch.version.cuda}) cannot start it: the NVIDIA "
               "driver may be older than that CUDA needs (nvidia-smi shows the driver's CUDA version)")
    return f"An NVIDIA GPU is installed but {why}, so the lab runs on the CPU."


def _cpu_flags_and_model() -> tuple[set[str], str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # macOS, Windows: no /proc
        return set(), platform.processor() or platform.machine()
    flags = re.search(r"^flags\s*:\s*(.*)$", text, re.MULTILINE)
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.MULTILINE)
    return (set(flags.group(1).split()) if flags else set(),
            model.group(1).strip() if model else platform.machine())


# oneDNN's instruction-set levels, lowest first (its ONEDNN_MAX_CPU_ISA values). bf16 is fast from
# AVX512_CORE_BF16 up and uses AMX from AVX512_CORE_AMX up; below, oneDNN emulates bf16 (measured
# on 2 cores at 64 px: a bf16 training step 9x slower than fp32).
_ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX",
                "AVX512_CORE_AMX", "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "DEFAULT", "ALL")


def cpu_bf16_units(flags: set[str], max_isa: str | None = None) -> str:
    """Name the bf16 matrix units torch can use: "amx", "avx512_bf16" or "none".

    From the CPU's feature flags, capped by oneDNN's ``ONEDNN_MAX_CPU_ISA`` (``max_isa``; default:
    the environment), which stops oneDNN from using units the CPU has. Setting it to ``AVX2``
    makes a CPU with bf16 units behave, and classify, as one without.
    """
    if max_isa is None:
        max_isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL"
    level = _ONEDNN_ISAS.index(max_isa.upper()) if max_isa.upper() in _ONEDNN_ISAS else len(_ONEDNN_ISAS)
    if "amx_bf16" in flags and level >= _ONEDNN_ISAS.index("AVX10_1_512_AMX"):
        return "amx"
    if ("avx512_bf16" in flags or "amx_bf16" in flags) and level >= _ONEDNN_ISAS.index("AVX512_CORE_BF16"):
        return "avx512_bf16"
    return "none"


def classify(device: str, compute_capability: str | None, cpu_units: str) -> str:
    """Map a device to its device class."""
    if device == "cuda":
        major = int(str(compute_capability or "0").split(".")[0])
        return "cuda-tensorcore" if major >= 7 else "cuda"
    if device == "mps":
        return "mps"
    return "cpu-bf16" if cpu_units != "none" else "cpu"


# Dense float16 tensor-core FLOPs per SM per clock, by compute capability, from the vendors'
# datasheets: a T4's 65 TFLOPS = 40 SMs x 1024 x 1.59 GHz, an A100's 312 = 108 x 2048 x 1.41, an
# H100 SXM's 989 = 132 x 4096 x 1.83, a B200's 2250 = 148 x 8192 x 1.86. V100, A10, L4 and the
# RTX 20-50 series have 1024 (an A10: 72 x 1024 x 1.70 = 125).
_TENSOR_FLOPS_PER_SM_CLOCK = {(8, 0): 2048, (9, 0): 4096, (10, 0): 8192}
# One profile cannot fit a T4 and an H100. The cuda-tensorcore profile's training step (128 px,
# batch 128: about 0.23 TFLOP) takes some 15 ms in fp16 on a T4 at a quarter of its peak, but
# about 1 ms on an H100, shorter than eager PyTorch's per-kernel launch cost for ResNet-18's
# step: AMP, checkpointing and the loader would be timed against launch overhead, not work.
# The xl profile's step (6x the work) would take about 0.5 s in fp32 on a T4, so each fp32
# measurement (warm-up, measured steps, paired rounds: about 125 steps) a minute, several per
# notebook. So GPUs of XL_TFLOPS and up (A100, H100, H200, B200, L40S, RTX
# 4090/5090) with XL_MEMORY_GIB or more run cuda-tensorcore-xl; T4, V100, A10, A30, L4 and
# smaller RTX cards, and MIG slices (fewer SMs, less memory), the T4-sized profile. These are
# estimates from datasheets, not measurements: no GPU has run the lab yet, and calibrate sets
# the bars on the grading GPU either way.
XL_TFLOPS = 200.0
XL_MEMORY_GIB = 20.0


def tensor_tflops(capability: tuple[int, int], sm_count: int, clock_khz: float) -> float:
    """A GPU's dense float16 tensor-core peak in TFLOPS, from its SMs and clock (0 below 7.0)."""
    if capability[0] < 7:
        return 0.0
    return sm_count * _TENSOR_FLOPS_PER_SM_CLOCK.get(capability, 1024) * clock_khz * 1e3 / 1e12


def gpu_profile(capability: tuple[int, int], sm_count: int, clock_khz: float, memory_bytes: int) -> str:
    """The profile of a CUDA GPU's family: ``cuda-tensorcore-xl`` for the A100/H100 family (see
    XL_TFLOPS), else its device class's."""
    device_class = classify("cuda", f"{capability[0]}.{capability[1]}", "none")
    if (device_class == "cuda-tensorcore" and tensor_tflops(capability, sm_count, clock_khz) >= XL_TFLOPS
            and memory_bytes >= XL_MEMORY_GIB * 2**30):
        return "cuda-tensorcore-xl"
    return device_class


def same_machine(a: dict, b: dict, *, cores: bool = False) -> bool:
    """Whether two recorded machines (Machine facts) are the same one: the same device class and
    device name, and with ``cores`` the same CPU cores (``grade --jobs`` grades each submission on
    a share of them). The one rule for "this machine"."""
    keys = ("device_class", "device_name") + (("cpu_cores",) if cores else ())
    return all(a.get(k) == b.get(k) for k in keys)


def describe_machine(device: torch.device | None = None) -> Machine:
    """Describe this machine and classify it."""
    import torchvision  # imported here: labsupport.hardware itself must not need it

    device = device or pick_device()
    flags, cpu_model = _cpu_flags_and_model()
    units = cpu_bf16_units(flags)
    capability = profile = None
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        capability = f"{major}.{minor}"
        name = torch.cuda.get_device_name(device)
        # Native bf16 only: a T4 (compute capability 7.5) "supports" bf16 through emulation, slowly.
        bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
        props = torch.cuda.get_device_properties(device)
        profile = gpu_profile((major, minor), props.multi_processor_count,
                              getattr(props, "clock_rate", 1.5e6), props.total_memory)
    elif device.type == "mps":
        name, bf16 = "Apple MPS", False  # bf16 autocast on MPS is new and not faster; fp16 is
    else:
        name, bf16 = cpu_model, units != "none"
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    device_class = classify(device.type, capability, units)
    return Machine(
        device=device.type,
        device_class=device_class,
        device_name=name,
        compute_capability=capability,
        cpu_model=cpu_model,
        cpu_cores=cores,
        torch_threads=torch.get_num_threads(),
        bf16=bf16,
        cpu_bf16_units=units,
        profile=profile or device_class,
        torch_version=torch.__version__,
        torchvision_version=torchvision.__version__,
        python_version=platform.python_version(),
        platform=platform.platform(),
    )


# The oldest torch whose APIs the lab uses, per device type, and why (read from the code: torch 2.9
# brought the fp32_precision TF32 settings, ls.train.exact_fp32; MPS's float16 autocast, GradScaler
# and Inductor backend are older). pyproject.toml, which a Colab `pip install` of labsupport reads,
# asks for the highest of these, so Colab's own torch is kept wherever it is new enough; setup() warns
# on an older torch (Colab and clusters come with their own).
TORCH_FLOORS: dict[str, tuple[tuple[int, int], str]] = {
    "cpu": ((2, 9), "TF32 off through torch.backends' fp32_precision settings (03, 04 gradient checks)"),
    "cuda": ((2, 9), "the fp32_precision settings (TF32 is on by default on Ampere and newer)"),
    "mps": ((2, 9), "the fp32_precision settings, float16 autocast on MPS, a GradScaler that runs on MPS "
                    "(no float64) and Inductor's MPS backend"),
}
# What only part of one notebook needs, asked for there (07's int8 cell calls require_torch("int8"));
# requirements.txt, the full environment, asks for it too.
FEATURE_FLOORS: dict[str, tuple[tuple[int, int], str]] = {
    "int8": ((2, 11), "07's int8 quantisation: torchao 0.18's PT2E flow, and torchao 0.18 dropped torch "
                      "older than 2.11"),
}
UPGRADE_COST = ("Upgrading torch downloads several GB (torch with its CUDA libraries, about 5 GB) and takes "
                "minutes, and Colab then needs Runtime > Restart session")


def torch_problem(device_type: str, version: str | None = None) -> str | None:
    """Why this torch is too old for the lab on ``device_type`` (or for a feature of FEATURE_FLOORS), or None."""
    version = version or torch.__version__
    found = tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:2])
    floor, why = {**TORCH_FLOORS, **FEATURE_FLOORS}[device_type]
    if found < floor:
        return (f"torch {version} is older than the lab needs on {device_type} (torch {floor[0]}.{floor[1]} or "
                f"newer: {why}); run pip install -U 'torch>={floor[0]}.{floor[1]}' torchvision")
    return None


def require_torch(feature: str) -> None:
    """Stop, saying what an upgrade costs, where this torch is too old for ``feature`` ("int8": 07)."""
    problem = torch_problem(feature)
    if problem:
        raise RuntimeError(f"{problem}. {UPGRADE_COST}. Everything before this cell works with this torch.")


def compile_problem(machine: Machine) -> str | None:
    """Why ``torch.compile``'s default backend cannot run on this machine, or None if it can.

    Inductor generates GPU kernels with Triton, which needs compute capability 7.0 or newer: on an
    older GPU (class ``cuda``, a P100 say) the first compiled call raises.
    """
    if machine.device == "cuda" and int(str(machine.compute_capability or "0").split(".")[0]) < 7:
        return (f"{machine.device_name} has compute capability {machine.compute_capability}; torch.compile's "
                "GPU kernels (Inductor, through Triton) need 7.0 or newer, so compile is not measured or graded here")
    return None


def profile_for(default: str, override: str | None = None) -> Profile:
    """The scale profile ``default`` (a machine's ``profile``, or a device class), with ``LAB_PROFILE``
    applied.

    ``override`` (default: the ``LAB_PROFILE`` variable) is ``name`` or ``name:field=value,...``.
    """
    spec = os.environ.get("LAB_PROFILE", "") if override is None else override
    name, _, fields = spec.strip().partition(":")
    name = name or default
    if name not in PROFILES:
        raise ValueError(f"Unknown profile {name!r} (from LAB_PROFILE); choose one of "
                         f"{', '.join(PROFILES)}, optionally followed by ':batch_size=16,...'.")
    profile = PROFILES[name]
    editable = [f.name for f in dataclasses.fields(Profile) if f.name != "name"]
    changes = {}
    for item in filter(None, (f.strip() for f in fields.split(","))):
        key, _, value = item.partition("=")
        if key not in editable:
            raise ValueError(f"LAB_PROFILE: {key!r} is not a profile field; fields are "
                             f"{', '.join(editable)}.")
        changes[key] = value.lower() in ("1", "true", "yes") if key == "grades_speed" else int(value)
    if changes:
        # An edited profile is no longer the class's reference scale: name it so results say so.
        changes["name"] = f"{name}:" + ",".join(f"{k}={v}" for k, v in changes.items())
    return dataclasses.replace(profile, **changes)


@dataclass(frozen=True)
class Lab:
    """Everything a notebook decides once in its first cell."""

    device: torch.device  # where tensors and the model live
    machine: Machine  # what it runs on; stored with every result
    profile: Profile  # how much work each measurement does here
    seed: int  # seed for torch, numpy and random

    def show(self) -> None:
        """Print the machine and profile as two small tables (pandas, for notebooks and terminals)."""
        import pandas as pd

        with pd.option_context("display.max_colwidth", 70):
            print(pd.Series(self.machine.as_dict(), name="machine").to_string(), "\n")
            print(pd.Series(dataclasses.asdict(self.profile), name="profile").to_string())


def quiet_library_logs(device: torch.device) -> None:
    """Silence library log lines that read as faults and are not.

    - The profiler's kineto prints "USDT: profiler_start" lines on every run, and on a machine
      without a GPU "ERROR: gpuGetDeviceCount failed". ``KINETO_LOG_LEVEL`` (read when a profile
      starts) above its highest level turns them off; set it yourself, to 0 say, to see them.
    - Off CUDA, Inductor's C++ build imports ``torch.utils.cpp_extension``, which warns "No CUDA
      runtime is found" on the CUDA build of torch: true, and expected on a CPU.
    - torch 2.11's profiler warns "Profiler clears events at the end of each cycle" on every
      profiled run, one cycle or many (pytorch/pytorch#180348, fixed in 2.12 by #180387): seen in
      01's profiler cell on an H200 with torch 2.11. The lab profiles one cycle, which loses nothing.
    """
    import logging

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    warnings.filterwarnings("ignore", message="Warning: Profiler clears events at the end of each cycle",
                            category=UserWarning)
    if device.type != "cuda":
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def setup(seed: int = 0, show: bool = True) -> Lab:
    """Pick the device, describe the machine, choose the profile and seed RNGs; from here on this
    process allocates as a long-running one does (:func:`labsupport.measure.steady_heap`)."""
    from .measure import steady_heap
    from .paths import use_drive_in_colab
    from .train import seed_everything

    steady_heap()  # allocate as a long-running process does, as the grader's processes do
    use_drive_in_colab()  # Colab: results, data and report in a Google Drive folder
    device = pick_device()
    quiet_library_logs(device)
    problem = torch_problem(device.type)
    if problem:
        warnings.warn(problem, LabWarning, stacklevel=2)
    machine = describe_machine(device)
    lab = Lab(device, machine, profile_for(machine.profile), seed)
    seed_everything(seed)
    if show:
        lab.show()
    return lab
