"""The machine the lab runs on: which device, what it can do, and the lab's setup on it.

Every result the lab records carries a :class:`Machine` description; :func:`setup` (every
notebook's first cell) picks the device, describes and classifies the machine, and chooses its
scale profile. The device classes and their profiles live in :mod:`labsupport.device_classes`
(re-exported here: ``hardware.CLASSES``, ``hardware.PROFILES``, ``hardware.profile_for``, ...).

Overrides (environment variables, read when called, never on import):

- ``LAB_DEVICE=cpu|cuda|mps`` forces the device.
- ``LAB_PROFILE=<name>[:field=value,...]`` picks another profile, e.g. ``LAB_PROFILE=tiny`` for
  tests or ``LAB_PROFILE=cpu-bf16:batch_size=16``. The tiny profile never grades speed.
- ``ONEDNN_MAX_CPU_ISA`` (oneDNN's own) caps the CPU units torch uses, and the class follows it:
  ``AVX512_CORE_BF16`` makes an AMX CPU class ``cpu-bf16``, ``AVX2`` class ``cpu``.
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

from .device_classes import (CLASSES, DEVICE_CLASSES, PROFILES, XL_MEMORY_GIB, XL_TFLOPS, DeviceClass,  # noqa: F401
                             Profile, classify, cpu_bf16_units, gpu_profile, profile_for, tensor_tflops)


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
