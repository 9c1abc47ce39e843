"""Device classes, scale profiles and the machine description."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from labsupport import hardware
from labsupport.hardware import PROFILES, classify, cpu_bf16_units, profile_for


@pytest.mark.parametrize("device, capability, units, expected", [
    ("cuda", "8.0", "none", "cuda-tensorcore"),  # A100
    ("cuda", "7.5", "amx", "cuda-tensorcore"),  # T4 (the CPU does not matter)
    ("cuda", "6.1", "none", "cuda"),  # P4 / GTX 10xx: no tensor cores
    ("mps", None, "none", "mps"),
    ("cpu", None, "amx", "cpu-amx"),  # Intel Xeon from Sapphire Rapids
    ("cpu", None, "avx512_bf16", "cpu-bf16"),  # AMD Zen 4 and 5, Intel Cooper Lake: no AMX
    ("cpu", None, "none", "cpu"),
])
def test_classify(device, capability, units, expected):
    assert classify(device, capability, units) == expected


def test_bf16_units_from_cpu_flags():
    assert cpu_bf16_units({"avx2", "amx_bf16", "avx512_bf16"}, "ALL") == "amx"
    assert cpu_bf16_units({"avx512f", "avx512_bf16"}, "ALL") == "avx512_bf16"
    assert cpu_bf16_units({"avx2", "avx512f"}, "ALL") == "none"


def test_onednn_isa_cap_hides_bf16_units(monkeypatch):
    """ONEDNN_MAX_CPU_ISA stops oneDNN from using the units, so the class follows it."""
    amx = {"avx2", "amx_bf16", "avx512_bf16"}
    assert cpu_bf16_units(amx, "avx2") == "none"
    assert cpu_bf16_units(amx, "AVX512_CORE_BF16") == "avx512_bf16"
    assert cpu_bf16_units(amx, "AVX512_CORE_AMX") == "amx"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cpu_bf16_units(amx) == "none"
    # so an AMX machine capped at AVX-512 BF16 is graded as the CPUs without AMX are
    assert classify("cpu", None, cpu_bf16_units(amx, "AVX512_CORE_BF16")) == "cpu-bf16"


def test_the_two_bf16_cpu_kinds_are_classes_of_their_own_with_their_own_bars():
    """AMX CPUs and AVX-512 BF16 CPUs without AMX share their profile's sizes, but not their bars:
    the reference missed three of the one class's bars on the second kind (issue 63). Each bar of
    the AVX-512 BF16 class that differs says, beside it, what it was and what the reference measured."""
    import tomllib

    amx, bf16 = hardware.CLASSES["cpu-amx"], hardware.CLASSES["cpu-bf16"]
    assert dataclasses.replace(amx.profile, name="") == dataclasses.replace(bf16.profile, name="")
    text = (Path(hardware.__file__).parent / "thresholds.toml").read_text()
    checks = tomllib.loads(text)["checks"]
    for name, spec in checks.items():
        assert ("cpu-amx" in spec and "cpu-bf16" in spec) or "every-class" in spec, \
            f"{name} has a bar for each bf16 CPU kind"
    differ = {name for name, spec in checks.items() if "every-class" not in spec and spec["cpu-amx"] != spec["cpu-bf16"]}
    assert differ == {"04-time-overhead", "05-compile-speedup", "06-end-to-end"}
    for name in differ:
        table = text.split(f'[checks."{name}"]')[1].split("[checks.")[0]
        said = table.split("cpu-bf16 =")[0].rsplit("cpu-amx =", 1)[1]
        was = re.search(r"cpu-bf16 \(.*?\) was (\d+(?:\.\d+)?)", said)
        assert was and float(was.group(1)) == checks[name]["cpu-amx"], f"{name}: the comment says what the bar was"
        assert "AMD EPYC" in said and "issue 63" in said, f"{name}: the comment says what the reference measured where"


def test_every_device_class_has_one_row_in_the_table():
    """One table per device class: profile and grading cell limit. The 16-bit type, the scaler and
    whether to compile training are not in it: choosing them is what 03 and 05 teach."""
    assert hardware.DEVICE_CLASSES == tuple(hardware.CLASSES)
    for name, cls in hardware.CLASSES.items():
        assert cls.name == name and cls.profile is hardware.PROFILES[name] and cls.profile.grades_speed
        assert 60 <= cls.cell_timeout_s <= 900
    assert not hasattr(hardware, "autocast_dtype"), "03's answer must not ship in labsupport"


def test_this_machine_is_classified_from_its_cpu_flags(monkeypatch):
    monkeypatch.delenv("LAB_DEVICE", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    machine = hardware.describe_machine()
    assert machine.device_class in hardware.DEVICE_CLASSES
    assert machine.torch_version == torch.__version__ and machine.cpu_cores >= 1
    if torch.cuda.is_available():
        pytest.skip("a GPU machine: the CPU-class expectation below does not apply")
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo to check against")
    flags = set(next(line for line in cpuinfo.read_text().splitlines()
                     if line.startswith("flags")).split(":")[1].split())
    expected = "cpu-amx" if "amx_bf16" in flags else "cpu-bf16" if "avx512_bf16" in flags else "cpu"
    assert machine.device_class == expected and machine.bf16 == (expected != "cpu")


def test_lab_device_forces_cpu(monkeypatch):
    monkeypatch.setenv("LAB_DEVICE", "cpu")
    assert hardware.pick_device().type == "cpu"
    monkeypatch.setenv("LAB_DEVICE", "tpu")
    with pytest.raises(ValueError, match="LAB_DEVICE"):
        hardware.pick_device()


def test_every_class_has_a_profile_that_grades_speed():
    for cls in hardware.DEVICE_CLASSES:
        assert PROFILES[cls].grades_speed
    assert not PROFILES["tiny"].grades_speed


def test_profile_override(monkeypatch):
    monkeypatch.delenv("LAB_PROFILE", raising=False)
    assert profile_for("cpu-bf16") == PROFILES["cpu-bf16"]
    monkeypatch.setenv("LAB_PROFILE", "tiny")
    assert profile_for("cpu-bf16") == PROFILES["tiny"]
    p = profile_for("cpu", override="cpu-bf16:batch_size=16,measure_steps=4")
    assert (p.batch_size, p.measure_steps, p.image_size) == (16, 4, 112)
    assert p.name == "cpu-bf16:batch_size=16,measure_steps=4"  # results say it was edited
    with pytest.raises(ValueError, match="Unknown profile"):
        profile_for("cpu", override="huge")
    with pytest.raises(ValueError, match="not a profile field"):
        profile_for("cpu", override="cpu:colour=3")


def test_setup_returns_device_machine_and_profile(monkeypatch, capsys):
    """ls.setup() also steadies the heap, so that a notebook's self-check measures as the grader's
    processes do (measure.steady_heap)."""
    from labsupport import measure

    steadied = []
    monkeypatch.setattr(measure, "steady_heap", lambda: steadied.append(True) or True)
    monkeypatch.setenv("LAB_PROFILE", "tiny")
    lab = hardware.setup(seed=3)
    out = capsys.readouterr().out
    assert lab.profile.name == "tiny" and lab.seed == 3 and steadied == [True]
    assert "device_class" in out and "image_size" in out


def test_a_gpu_torch_cannot_use_is_reported_not_silently_replaced(monkeypatch):
    """A GPU older than the torch build supports, or one the build cannot start, is named in a
    warning that says how to use it; the lab then runs on the CPU (or MPS)."""
    import warnings

    from labsupport import hardware

    monkeypatch.delenv("LAB_DEVICE", raising=False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    # A P100 (6.0) with the default CUDA 13 wheels (sm_75 and newer).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (6, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla P100-PCIE-16GB")
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"])
    with pytest.warns(hardware.LabWarning, match=r"Tesla P100.*6\.0.*older than this torch build.*cu126"):
        assert hardware.pick_device().type == "cpu"
    # An A10 (8.6) runs the sm_80 kernels: used, nothing said.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hardware.pick_device().type == "cuda"
    # A GPU the driver lists, and a torch that cannot start it.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hardware, "_nvidia_gpu_present", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.warns(hardware.LabWarning, match="NVIDIA GPU is installed but torch .* cannot start it"):
        assert hardware.pick_device().type == "cpu"
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.warns(hardware.LabWarning, match="CPU-only build"):
        assert hardware.pick_device().type == "cpu"


@pytest.mark.parametrize("capability, arch_list, runs", [
    ((7, 5), ["sm_75", "sm_80"], True), ((8, 6), ["sm_80"], True), ((8, 9), ["sm_80", "sm_90"], True),
    ((7, 0), ["sm_75", "sm_80"], False), ((6, 1), ["sm_50", "sm_60", "sm_70"], True),
    ((12, 0), ["sm_80", "sm_90", "compute_90"], True), ((12, 0), ["sm_80", "sm_90a"], False)])
def test_which_gpus_a_torch_build_runs_on(capability, arch_list, runs):
    from labsupport import hardware

    assert hardware._runs_on(capability, arch_list) is runs


def test_compile_is_not_graded_on_gpus_older_than_compute_capability_7():
    """Inductor's GPU kernels need Triton, which needs compute capability 7.0: on class cuda 05's
    check says so (n/a, without compiling), and its bar is n/a there."""
    import dataclasses

    from labsupport import grading, hardware

    machine = hardware.describe_machine(torch.device("cpu"))
    old = dataclasses.replace(machine, device="cuda", device_class="cuda", device_name="Tesla P100-PCIE-16GB",
                              compute_capability="6.0")
    assert "need 7.0 or newer" in hardware.compile_problem(old)
    assert hardware.compile_problem(dataclasses.replace(old, device_class="cuda-tensorcore",
                                                        compute_capability="7.5")) is None
    assert hardware.compile_problem(machine) is None
    assert grading.threshold_for("05-compile-speedup", old.as_dict())[0] is None


def test_the_torch_floor_is_right_per_platform():
    """requirements.txt (the full environment) asks for the newest torch anything needs; pyproject.toml,
    what a Colab `pip install` of labsupport reads, asks for what every device type needs and no more,
    so Colab's own torch is kept where it is new enough; an older torch is named with what it lacks."""
    import re

    from labsupport import hardware

    checkout = Path(__file__).resolve().parents[1]
    lab = max(floor for floor, _ in hardware.TORCH_FLOORS.values())
    anything = max(floor for floor, _ in {**hardware.TORCH_FLOORS, **hardware.FEATURE_FLOORS}.values())
    for name, need in (("requirements.txt", anything), ("pyproject.toml", lab)):
        asked = re.search(r"torch>=(\d+)\.(\d+)", (checkout / name).read_text())
        assert asked and (int(asked[1]), int(asked[2])) >= need, name
    asked = re.search(r"torch>=(\d+)\.(\d+)", (checkout / "pyproject.toml").read_text())
    assert (int(asked[1]), int(asked[2])) == lab, "pyproject.toml asks for more than the lab needs: Colab's torch is replaced"
    assert "MPS" in hardware.torch_problem("mps", "2.5.1") and "2.9" in hardware.torch_problem("mps", "2.5.1")
    assert "torchao" in hardware.torch_problem("int8", "2.10.0") and hardware.torch_problem("cpu", "2.10.0") is None
    assert hardware.torch_problem("cuda", "2.8.0+cu128") is not None
    assert hardware.torch_problem("cpu", "2.14.1+cu130") is None
    assert hardware.torch_problem("cpu", torch.__version__) is None


def test_require_torch_says_what_an_upgrade_costs(monkeypatch):
    """07's int8 cell stops on a torch older than its floor, saying the upgrade's cost, and passes on a
    new one; 07's fp32 serving does not import torchao on the older torch."""
    from labsupport import hardware

    monkeypatch.setattr(torch, "__version__", "2.10.0+cu126")
    with pytest.raises(RuntimeError, match="several GB.*Restart session"):
        hardware.require_torch("int8")
    import sys

    from labsupport import compress

    # 07's fp32 serving runs on that torch without torchao (made for 2.11): here it cannot import
    monkeypatch.setitem(sys.modules, "torchao.quantization.pt2e.quantizer.x86_inductor_quantizer", None)
    with compress.serving():
        pass
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    hardware.require_torch("int8")


def test_bf16_means_native_bf16_on_a_gpu(monkeypatch):
    """A T4 (7.5) "supports" bf16 through emulation: Machine.bf16 asks for native support only,
    so choose_precision does not pick a slow bf16 there."""
    from labsupport import hardware

    asked = []

    def is_bf16_supported(including_emulation=True):
        asked.append(including_emulation)
        return including_emulation  # a T4: emulated only

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    _pretend_gpu(monkeypatch, "Tesla T4", (7, 5), sm_count=40, clock_khz=1_590_000, memory_gib=15)
    machine = hardware.describe_machine(torch.device("cuda"))
    assert machine.device_class == "cuda-tensorcore" and machine.bf16 is False and asked == [False]


def _pretend_gpu(monkeypatch, name, capability, *, sm_count, clock_khz, memory_gib):
    """torch.cuda answering as a GPU of that kind would (for describe_machine, on any machine)."""
    from types import SimpleNamespace

    props = SimpleNamespace(name=name, major=capability[0], minor=capability[1], multi_processor_count=sm_count,
                            clock_rate=clock_khz, total_memory=int(memory_gib * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)


# name, compute capability, SMs, clock (kHz, as torch reports it), memory (GiB), profile
GPUS = [
    ("Tesla T4", (7, 5), 40, 1_590_000, 15, "cuda-tensorcore"),  # 65 TFLOPS
    ("Tesla V100-SXM2-32GB", (7, 0), 80, 1_530_000, 32, "cuda-tensorcore"),  # 125
    ("NVIDIA A10", (8, 6), 72, 1_695_000, 22, "cuda-tensorcore"),  # 125
    ("NVIDIA L4", (8, 9), 58, 2_040_000, 22, "cuda-tensorcore"),  # 121
    ("NVIDIA A30", (8, 0), 56, 1_440_000, 24, "cuda-tensorcore"),  # 165
    ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", (8, 0), 42, 1_410_000, 19.5, "cuda-tensorcore"),  # a slice
    ("NVIDIA A100-SXM4-40GB", (8, 0), 108, 1_410_000, 39.4, "cuda-tensorcore-xl"),  # 312
    ("NVIDIA H100 80GB HBM3", (9, 0), 132, 1_980_000, 79.1, "cuda-tensorcore-xl"),  # 1071
    ("NVIDIA GeForce RTX 4090", (8, 9), 128, 2_520_000, 23.6, "cuda-tensorcore-xl"),  # 330
    ("NVIDIA B200", (10, 0), 148, 1_965_000, 178, "cuda-tensorcore-xl"),  # 2382
    ("Tesla P100-PCIE-16GB", (6, 0), 56, 1_329_000, 16, "cuda"),  # no tensor cores
]


@pytest.mark.parametrize("name, capability, sm_count, clock_khz, memory_gib, profile", GPUS,
                         ids=[g[0] for g in GPUS])
def test_each_gpu_family_runs_its_own_profile(monkeypatch, name, capability, sm_count, clock_khz,
                                              memory_gib, profile):
    """One cuda-tensorcore profile cannot fit a T4 and an H100 (hardware.XL_TFLOPS says why): the
    A100/H100 family runs cuda-tensorcore-xl, with the class's checks and bars."""
    monkeypatch.delenv("LAB_PROFILE", raising=False)
    _pretend_gpu(monkeypatch, name, capability, sm_count=sm_count, clock_khz=clock_khz, memory_gib=memory_gib)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: capability >= (8, 0))
    machine = hardware.describe_machine(torch.device("cuda"))
    assert machine.profile == profile and machine.device_class in hardware.DEVICE_CLASSES
    assert profile == machine.device_class or machine.device_class == "cuda-tensorcore"
    assert profile_for(machine.profile).name == profile
    assert profile_for(machine.profile, "cuda-tensorcore").name == "cuda-tensorcore"  # LAB_PROFILE wins


def test_the_xl_profile_does_more_work_per_step_than_the_t4_sized_one():
    small, xl = PROFILES["cuda-tensorcore"], PROFILES["cuda-tensorcore-xl"]
    work = (xl.image_size / small.image_size) ** 2 * xl.batch_size / small.batch_size
    assert 4 <= work <= 8 and xl.grades_speed
    assert xl.image_size <= 160  # the dataset's JPEGs are 160 px: no upsampling


def test_torch_2_11s_profiler_warning_is_quieted_and_others_are_not():
    """torch 2.11 warns "Profiler clears events..." on every profiled run, one cycle or many
    (pytorch/pytorch#180348; seen in 01 on an H200): setup's quieting drops exactly that text."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hardware.quiet_library_logs(torch.device("cpu"))
        # torch 2.11's text, missing spaces included (torch/profiler/profiler.py, prepare_trace)
        warnings.warn("Warning: Profiler clears events at the end of each cycle.Only events from the current "
                      "cycle will be reported.To keep events across cycles, set acc_events=True.", UserWarning)
        warnings.warn("a student's own warning", UserWarning)
    assert [str(w.message) for w in caught] == ["a student's own warning"]


ZEN4 = {"vendor": "AuthenticAMD", "family": 25, "model": 0x11, "flags": {"avx2", "fma", "avx512f", "avx512_bf16"},
        "mhz": 2596.0}


@pytest.mark.parametrize("info, dtype, units, expected", [
    (ZEN4, "float32", "avx512_bf16", 32),  # two 256-bit FMA pipes, AVX-512 on both halves
    (ZEN4, "bfloat16", "avx512_bf16", 64),  # the dot product: two bf16 products per fp32 lane
    (ZEN4, "bfloat16", "none", 32),  # ONEDNN_MAX_CPU_ISA=AVX2: bf16 emulated through fp32
    ({**ZEN4, "family": 26}, "float32", "avx512_bf16", 64),  # Zen 5: 512-bit pipes
    ({"vendor": "GenuineIntel", "family": 6, "model": 143, "flags": {"avx2", "fma", "avx512f", "amx_bf16"}},
     "bfloat16", "amx", 1024),
    ({"vendor": "GenuineIntel", "family": 6, "model": 143, "flags": {"avx2", "fma", "avx512f", "amx_bf16"}},
     "float32", "amx", 64),
    ({"vendor": "GenuineIntel", "family": 6, "model": 85, "flags": {"avx2", "fma"}}, "float32", "none", 32),
    ({"vendor": "", "family": -1, "flags": set()}, "float32", "none", None),  # an unknown core: said, not guessed
], ids=["zen4-fp32", "zen4-bf16", "zen4-bf16-capped", "zen5-fp32", "spr-amx-bf16", "spr-fp32", "avx2", "unknown"])
def test_flops_per_cycle_per_core_kind_and_dtype(info, dtype, units, expected):
    from labsupport import roofline

    assert roofline.flops_per_cycle(info, dtype, units)[0] == expected


def test_the_clock_is_sysfs_max_or_a_family_bound_and_never_proc_cpuinfos_current_one(monkeypatch):
    """A VM without cpufreq (the lab's 2-core EPYC) shows 2596 MHz in /proc/cpuinfo: its nominal
    clock, which boost exceeds, so never a bound. The fastest part of its family bounds it; an
    unknown CPU's clock is said to be unknown, and LAB_CPU_MAX_GHZ (a datasheet's) overrides."""
    from labsupport import roofline

    monkeypatch.delenv("LAB_CPU_MAX_GHZ", raising=False)
    ghz, how = roofline.cpu_clock_ghz(ZEN4, cpus=[10**6])  # a cpu number sysfs has no folder for
    assert ghz == 4.4 and "Genoa" in how and "not exposed" in how
    ghz, how = roofline.cpu_clock_ghz({**ZEN4, "vendor": "HygonGenuine"}, cpus=[10**6])
    assert ghz is None and "2596 MHz" in how and "LAB_CPU_MAX_GHZ" in how
    monkeypatch.setenv("LAB_CPU_MAX_GHZ", "3.7")
    assert roofline.cpu_clock_ghz({}, cpus=[10**6]) == (3.7, "LAB_CPU_MAX_GHZ")
    bound = roofline.theoretical("cpu", "bfloat16", cores=2, units="avx512_bf16", info=ZEN4)
    assert bound.flops_per_s == pytest.approx(2 * 3.7e9 * 64) and "2 cores" in bound.how


def test_the_theoretical_peak_bounds_every_kernel_measured_on_this_machine():
    """Issue 63: the "peak" make run printed was exceeded by two rungs (119%, 132%). The theoretical
    peak of this machine bounds every kernel measured here: matmuls at several sizes and the step's
    3x3 convolutions in both layouts, float32 and (with bf16 units) bfloat16."""
    from labsupport import roofline
    from labsupport.hardware import describe_machine

    machine = describe_machine()
    for dtype in ("float32",) + (("bfloat16",) if machine.cpu_bf16_units != "none" else ()):
        bound = roofline.theoretical("cpu", dtype)
        if bound.flops_per_s is None:
            pytest.skip(f"this machine's theoretical peak cannot be known: {bound.how}")
        for kernel in roofline.kernels("cpu", dtype, image_size=64, batch_size=8, min_run_time_s=0.05):
            assert kernel["GFLOP/s"] * 1e9 <= bound.flops_per_s, (dtype, kernel, bound.how)


def test_a_gpus_theoretical_peak_is_sms_times_clock_times_its_tensor_rate(monkeypatch):
    """An H100 SXM (132 SMs, 1.83 GHz): 989 dense fp16/bf16 TFLOPS, the datasheet's; float32 at
    TF32's half of it (a bound whether TF32 is on or not); a T4 (7.5) has no native bf16, so its
    bf16 bound is its float32 one; a torch that does not report the clock gets no figure."""
    from types import SimpleNamespace

    import torch

    from labsupport import roofline

    gpu = SimpleNamespace(major=9, minor=0, multi_processor_count=132, clock_rate=1.83e6)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: gpu)
    assert roofline.theoretical("cuda", "bfloat16").flops_per_s == pytest.approx(989.4e12, rel=1e-3)
    assert roofline.theoretical("cuda", "float32").flops_per_s == pytest.approx(989.4e12 / 2, rel=1e-3)
    gpu.major, gpu.minor, gpu.multi_processor_count, gpu.clock_rate = 7, 5, 40, 1.59e6
    assert roofline.theoretical("cuda", "float16").flops_per_s == pytest.approx(65e12, rel=0.01)
    assert roofline.theoretical("cuda", "bfloat16").flops_per_s == pytest.approx(65e12 / 2, rel=0.01)
    del gpu.clock_rate
    assert roofline.theoretical("cuda", "float16").flops_per_s is None
