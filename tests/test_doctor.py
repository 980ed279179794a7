"""`fullthrottle doctor`: end to end on this machine (versions, CPU bf16 support, the CUDA
build and libraries, no NVIDIA driver, what `auto` picks), and its mismatch warnings on
composed reports of machines with GPUs (none of ours has one)."""

from __future__ import annotations

import copy
import glob
import importlib.metadata
import json
import os
import platform

import pytest
import tensorflow as tf

from fullthrottle.commands.doctor import cpu_facts, notes_for, render, warnings_for
from tests.helpers import run_cli
from trainer_module.training.hardware import PROC_DRIVER_VERSION

GPUS = tf.config.list_physical_devices("GPU")
NO_DRIVER_HERE = (
    not GPUS and not os.path.exists(PROC_DRIVER_VERSION) and not glob.glob("/dev/nvidia*")
)


def _cpuinfo_flags() -> set[str]:
    # Read independently of the code under test.
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def test_doctor_reports_versions_bf16_and_the_auto_choices_of_this_machine():
    result = run_cli("doctor", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    versions = report["versions"]
    assert versions["Python"] == platform.python_version()
    assert versions["TensorFlow"] == tf.__version__
    for name, dist in (("TFX", "tfx"), ("Apache Beam", "apache-beam"), ("MLflow", "mlflow")):
        assert versions[name] == importlib.metadata.version(dist)

    flags = _cpuinfo_flags()
    native = bool(flags & {"avx512_bf16", "amx_bf16"})
    cpu = report["cpu"]
    assert cpu["native_bf16"] is native
    assert cpu["flags"]["avx512_bf16"] is ("avx512_bf16" in flags)
    assert cpu["flags"]["amx_bf16"] is ("amx_bf16" in flags)
    assert cpu["amx"] is ("amx_tile" in flags)
    if not tf.config.list_physical_devices("GPU"):
        # No GPU: auto trains in bf16 exactly when the CPU has it natively.
        assert report["auto"]["precision"] == ("mixed_bfloat16" if native else "float32")
        assert report["auto"]["strategy"] == "OneDeviceStrategy"
    build = tf.sysconfig.get_build_info()
    assert report["tensorflow"]["cuda_version"] == build.get("cuda_version")
    assert report["tensorflow"]["cudnn_version"] == build.get("cudnn_version")
    # The CUDA libraries of the build load from the lock's wheels, and say their versions.
    libraries = {lib["soname"]: lib for lib in report["cuda_libraries"]}
    assert libraries and all(lib["error"] is None for lib in libraries.values()), libraries
    assert all("site-packages/nvidia/" in lib["path"] for lib in libraries.values())
    assert libraries["libcudart.so.12"]["version"].startswith("12.")
    assert libraries["libcudnn.so.9"]["version"].startswith("9.")
    assert report["tensorflow"]["gpus"] == [
        {"name": d.name, **_details(d)} for d in tf.config.list_physical_devices("GPU")
    ]
    if NO_DRIVER_HERE:
        assert report["driver"] == {
            "error": "NVML Shared Library Not Found",
            "driver_version": None,
            "cuda_level": None,
            "gpus": [],
            "topology": [],
        }
        environment = report["gpu_environment"]
        assert environment["kernel_driver"] is None and environment["device_nodes"] == []
        assert "libcuda.so.1" in environment["libcuda_error"]
        assert report["interconnect"] is None
        assert report["warnings"] == [] and report["notes"] == []  # no GPU is not a problem


def _details(device) -> dict:
    details = tf.config.experimental.get_device_details(device)
    capability = details.get("compute_capability")
    return {
        "device_name": details.get("device_name"),
        "compute_capability": ".".join(map(str, capability)) if capability else None,
    }


def test_doctor_text_says_this_cpu_has_native_bf16():
    result = run_cli("doctor")
    assert result.returncode == 0, result.stderr[-3000:]
    # TensorFlow's C++ lines (oneDNN, `failed call to cuInit` without a GPU) need --verbose.
    assert result.stderr == ""
    text = result.stdout
    # Machines differ (AMD EPYC with AVX512_BF16, Intel Xeon with AVX512_BF16 and AMX, AVX2-only
    # ones): what doctor must name is read from this machine's own flags.
    flags = _cpuinfo_flags()
    native = [flag.upper() for flag in ("avx512_bf16", "amx_bf16") if flag in flags]
    if native:
        assert f"native bf16    yes ({', '.join(native)})" in text
        features = text.split("features", 1)[1].splitlines()[0]
        assert all(flag in features.split() for flag in native), features
    else:
        assert "native bf16    no" in text
    assert "What `auto` picks here" in text and "precision" in text
    if NO_DRIVER_HERE:  # says so, and that it is fine: exit status 0
        assert (
            "  driver         none found: NVML does not start (NVML Shared Library Not Found)"
            in text
        )
        assert (
            "  TensorFlow     sees no GPU, training runs on the CPU: no NVIDIA driver "
            "(libcuda.so.1 cannot be loaded)"
        ) in text
        assert "CUDA libraries 9 of 9 load (cudart 12." in text
        assert text.rstrip().endswith("No known pitfalls found.")


def test_doctor_resolves_auto_for_the_given_config_and_warns_about_pitfalls():
    result = run_cli(
        "doctor",
        "--json",
        "--set",
        "training.precision=mixed_bfloat16",
        env={"TF_ENABLE_ONEDNN_OPTS": "0"},
    )
    assert result.returncode == 1, result.stderr[-3000:]  # a warning: exit status 1
    report = json.loads(result.stdout)
    assert report["auto"]["precision"] == "mixed_bfloat16"
    assert "set in config" in report["auto"]["precision_reason"]
    assert any("TF_ENABLE_ONEDNN_OPTS=0" in w for w in report["warnings"])


def test_doctor_rejects_a_bad_override_with_a_message():
    result = run_cli("doctor", "--set", "training.precision=fp8")
    assert result.returncode == 2
    assert "training.precision" in result.stderr and "Traceback" not in result.stderr


def test_cpu_without_bf16_flags_is_reported_as_no_native_bf16(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Old Xeon\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n\n"
    )
    facts = cpu_facts(str(cpuinfo))
    assert facts["model"] == "Old Xeon"
    assert facts["native_bf16"] is False and facts["flags"]["avx512f"] is True
    cpuinfo.write_text(
        "model name\t: Sapphire Rapids\nflags\t\t: avx512f avx512_bf16 amx_tile amx_bf16\n"
    )
    facts = cpu_facts(str(cpuinfo))
    assert facts["native_bf16"] is True and facts["native_bf16_flags"] == [
        "avx512_bf16",
        "amx_bf16",
    ]
    assert facts["amx"] is True


# --- the decisions, on composed reports -----------------------------------------------------
CUDA_LIBRARY_NAMES = ("libcudart.so.12", "libcublas.so.12", "libcudnn.so.9", "libnccl.so.2")
NO_LIBCUDA = "libcuda.so.1: cannot open shared object file: No such file or directory"


def _report(**parts) -> dict:
    """A report as `collect` makes it, of a CPU machine with this lock and no NVIDIA driver (what
    `doctor --json` printed here); ``parts`` replace its sections."""
    report = {
        "cpu": {"native_bf16": True, "cpuinfo_readable": True},
        "tensorflow": {
            "is_cuda_build": True,
            "cuda_version": "12.5.1",
            "cudnn_version": "9",
            "cuda_compute_capabilities": ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"],
            "gpus": [],
            "library_dirs": [],
        },
        "cuda_libraries": [
            {"soname": name, "path": f"/venv/nvidia/x/lib/{name}", "version": None, "error": None}
            for name in CUDA_LIBRARY_NAMES
        ],
        "gpu_environment": {
            "is_cuda_build": True,
            "cuda_version": "12.5.1",
            "cuda_visible_devices": None,
            "kernel_driver": None,
            "device_nodes": [],
            "libcuda_error": NO_LIBCUDA,
            "missing_cuda_libraries": [],
        },
        "driver": {
            "error": "NVML Shared Library Not Found",
            "driver_version": None,
            "cuda_level": None,
            "gpus": [],
            "topology": [],
        },
        "interconnect": None,
        "nccl": {"available": True, "version": "2.32.3", "path": "/venv/libnccl.so.2"},
        "memory_growth": {"TF_FORCE_GPU_ALLOW_GROWTH": None, "trainer_enables_growth": True},
        "onednn": {"TF_ENABLE_ONEDNN_OPTS": None},
        "auto": {
            "precision": "mixed_bfloat16",
            "precision_reason": "",
            "strategy": "",
            "strategy_reason": "",
        },
    }
    for section, value in parts.items():
        if isinstance(value, dict) and isinstance(report.get(section), dict):
            report[section] = {**report[section], **value}
        else:
            report[section] = value
    return report


def _gpu_machine(count=2, *, name="NVIDIA A100-SXM4-40GB", capability="8.0", driver="570.86.15",
                 cuda_level="12.8", tensorflow_sees=None) -> dict:  # fmt: skip
    """A machine with ``count`` GPUs and a working driver, handed to the environment."""
    seen = count if tensorflow_sees is None else tensorflow_sees
    return {
        "gpu_environment": {
            "kernel_driver": driver,
            "device_nodes": [f"/dev/nvidia{i}" for i in range(count)],
            "libcuda_error": None,
        },
        "driver": {
            "error": None,
            "driver_version": driver,
            "cuda_level": cuda_level,
            "gpus": [
                {
                    "index": i,
                    "name": name,
                    "memory_mib": 40960,
                    "compute_capability": capability,
                    "pci_bus_id": f"00000000:{7 + i:02x}:00.0",
                    "nvlink_peers": [],
                    "nvswitch_links": 12,
                }
                for i in range(count)
            ],  # fmt: skip
            "topology": [],
        },
        "tensorflow": {
            **_report()["tensorflow"],
            "gpus": [
                {
                    "name": f"/physical_device:GPU:{i}",
                    "device_name": name,
                    "compute_capability": capability,
                }
                for i in range(seen)
            ],  # fmt: skip
        },
    }


def test_these_machines_need_nothing_fixed():
    assert warnings_for(_report()) == [] and notes_for(_report()) == []


def test_a_driver_on_the_host_that_the_chroot_does_not_see():
    # /proc shows the host's kernel module, but no /dev/nvidia* and no libcuda.so.1 got in.
    report = _report(gpu_environment={"kernel_driver": "550.54.15"})
    (warning,) = warnings_for(report)
    assert warning.startswith(
        "TensorFlow sees no GPU, so training runs on the CPU: the NVIDIA driver 550.54.15 is "
        "loaded on this machine (/proc/driver/nvidia/version) but neither a GPU device node"
    )
    assert "bin/envrun hands them over" in warning and "--gpus all" in warning


def test_nvml_sees_gpus_but_tensorflow_does_not():
    # Driver, nodes and libraries in place; the GPUs are older than every kernel of the build.
    report = _report(**_gpu_machine(2, name="Tesla M60", capability="5.2", tensorflow_sees=0))
    first, *rest = warnings_for(report)
    assert first.startswith("TensorFlow sees no GPU, so training runs on the CPU: the NVIDIA")
    assert "fullthrottle doctor" in first  # the one-line reason defers to the details below
    assert rest == [
        f"GPU {i} (Tesla M60, compute capability 5.2) is older than every GPU this TensorFlow has "
        "kernels for (sm_60, sm_70, sm_80, sm_89, compute_90): TensorFlow ignores it; train on a "
        "GPU of compute capability 6.0 or newer"
        for i in (0, 1)
    ]


def test_a_driver_too_old_for_the_cuda_12_wheels_is_said_once():
    machine = _gpu_machine(1, name="Tesla V100-SXM2-16GB", capability="7.0", driver="470.82.01",
                           cuda_level="11.4", tensorflow_sees=0)  # fmt: skip
    (warning,) = warnings_for(_report(**machine))
    assert "the NVIDIA driver 470.82.01 is older than 525.60" in warning
    assert "CUDA 12.5.1" in warning and "update the driver" in warning
    # With TensorFlow seeing the GPU anyway (it cannot, but the check does not depend on it).
    seen = _gpu_machine(1, driver="470.82.01", cuda_level="11.4")
    assert warnings_for(_report(**seen)) == [
        "the NVIDIA driver 470.82.01 is older than 525.60, the minimum for the CUDA 12.5.1 this "
        "TensorFlow was built with: update the driver"
    ]


def test_missing_cuda_libraries_are_named_with_what_to_do():
    libraries = _report()["cuda_libraries"]
    libraries[2] = {
        **libraries[2],
        "path": None,
        "error": "libcudnn.so.9: cannot open shared object file",
    }
    # On a CPU machine: the environment is broken all the same.
    (warning,) = warnings_for(_report(cuda_libraries=libraries))
    assert warning.startswith("TensorFlow's CUDA libraries do not load (libcudnn.so.9)")
    assert "tensorflow[and-cuda]" in warning
    # On a GPU machine it is also why TensorFlow sees no GPU: said once.
    machine = _gpu_machine(2, tensorflow_sees=0)
    machine["gpu_environment"]["missing_cuda_libraries"] = ["libcudnn.so.9"]
    (warning,) = warnings_for(_report(cuda_libraries=libraries, **machine))
    assert warning.startswith(
        "TensorFlow sees no GPU, so training runs on the CPU: TensorFlow's CUDA"
    )


def test_a_gpu_that_needs_ptx_and_a_driver_that_cannot_compile_it():
    h100 = {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}
    old = _report(**_gpu_machine(1, cuda_level="12.2", **h100))
    assert warnings_for(old) == [
        "GPU 0 (NVIDIA H100 80GB HBM3, compute capability 9.0) runs TensorFlow's kernels from PTX "
        "of CUDA 12.5.1, which this driver (CUDA 12.2) cannot compile: update the driver to one "
        "for CUDA 12.5 or newer"
    ]
    new = _report(**_gpu_machine(1, cuda_level="12.8", **h100))
    assert warnings_for(new) == []
    (note,) = notes_for(new)
    assert note.startswith("GPU 0 (NVIDIA H100 80GB HBM3, compute capability 9.0): this TensorFlow")
    # An A100 has machine code: an older CUDA level is only a note.
    a100 = _report(**_gpu_machine(1, cuda_level="12.2"))
    assert warnings_for(a100) == []
    assert notes_for(a100) == [
        "the driver supports CUDA 12.2, older than the CUDA 12.5.1 TensorFlow was built with: it "
        "runs by CUDA's minor-version compatibility, but PTX from the newer CUDA cannot be "
        "compiled by it"
    ]


def test_tensorflow_sees_gpus_but_nvml_does_not_start():
    machine = _gpu_machine(2)
    machine["driver"] = _report()["driver"]
    (warning,) = warnings_for(_report(**machine))
    assert warning.startswith("TensorFlow sees 2 GPU(s) but NVML does not start (NVML Shared")
    assert "libnvidia-ml.so.1" in warning and "MLflow logs no GPU metrics" in warning


def test_gpus_the_driver_sees_and_tensorflow_does_not():
    fewer = _report(**_gpu_machine(4, tensorflow_sees=2))
    assert warnings_for(fewer) == [
        "the driver sees 4 GPUs but TensorFlow only 2: run with --verbose to see TensorFlow's "
        "reason in its log"
    ]
    # Hidden on purpose: a note, not a warning.
    machine = _gpu_machine(4, tensorflow_sees=2)
    machine["gpu_environment"]["cuda_visible_devices"] = "0,1"
    hidden = _report(**machine)
    assert warnings_for(hidden) == []
    assert notes_for(hidden) == [
        "CUDA_VISIBLE_DEVICES='0,1': TensorFlow uses 2 of the 4 GPUs the driver sees"
    ]


def test_several_gpus_without_nccl_or_nvlink():
    machine = _gpu_machine(2)
    pcie = {"kind": "PCIe", "detail": "PCIe through a CPU's PCIe host bridge (1 pair)", "pairs": []}
    report = _report(
        nccl={"available": False, "version": None, "path": None}, interconnect=pcie, **machine
    )
    assert warnings_for(report) == [
        "several GPUs but no loadable NCCL: multi-GPU all-reduce falls back to slower paths"
    ]
    (note,) = notes_for(report)
    assert "over PCIe, without NVLink" in note and "gradient_accumulation_steps" in note


def test_a_gpu_report_renders_every_gpu_fact():
    machine = _gpu_machine(2)
    nvlink = {"kind": "NVLink", "detail": "NVLink through NVSwitch (1 pair)", "pairs": []}
    report = _report(interconnect=nvlink, **machine)
    report.update(
        versions={"Python": "3.13.5"},
        memory_gib=1024.0,
        cpu={**cpu_facts(), "native_bf16": True},
        auto={"precision": "mixed_float16", "precision_reason": "GPU compute capability (8, 0) >= 7.0",
              "strategy": "MirroredStrategy", "strategy_reason": "2 local devices"},
    )  # fmt: skip
    report["warnings"], report["notes"] = warnings_for(report), notes_for(report)
    text = render(copy.deepcopy(report))
    assert "  driver         570.86.15, supports CUDA 12.8 (NVML)" in text
    assert "  device nodes   /dev/nvidia0 /dev/nvidia1" in text
    assert "  libcuda.so.1   loads" in text
    assert (
        "  GPU 0          NVIDIA A100-SXM4-40GB, 40 GiB, compute capability 8.0, PCI 00000000:07:00.0"
        in text
    )
    assert "  GPU 1          NVIDIA A100-SXM4-40GB, 40 GiB" in text
    assert "  interconnect   NVLink: NVLink through NVSwitch (1 pair)" in text
    assert (
        "  TensorFlow     /physical_device:GPU:1: NVIDIA A100-SXM4-40GB, compute capability 8.0"
        in text
    )
    assert "  precision      mixed_float16" in text and "No known pitfalls found." in text


@pytest.mark.parametrize("hidden", ["", "-1"])
def test_hiding_every_gpu_is_the_reason_given(hidden):
    machine = _gpu_machine(1, tensorflow_sees=0)
    machine["gpu_environment"]["cuda_visible_devices"] = hidden
    (warning,) = warnings_for(_report(**machine))
    assert warning == (
        "TensorFlow sees no GPU, so training runs on the CPU: "
        f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU (unset it to use them)"
    )
    assert notes_for(_report(**machine)) == []


def test_variables_that_slow_training_down_are_read_from_the_report():
    report = _report(
        onednn={"TF_ENABLE_ONEDNN_OPTS": "0"},
        memory_growth={"TF_FORCE_GPU_ALLOW_GROWTH": "false"},
    )
    (onednn,) = warnings_for(report)  # no GPU: memory growth does not matter
    assert onednn.startswith("TF_ENABLE_ONEDNN_OPTS=0 disables oneDNN")
    on_gpus = _report(memory_growth={"TF_FORCE_GPU_ALLOW_GROWTH": "false"}, **_gpu_machine(1))
    (growth,) = warnings_for(on_gpus)
    assert growth.startswith("TF_FORCE_GPU_ALLOW_GROWTH=false: memory growth is off")
