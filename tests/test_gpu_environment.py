"""The locked environment is GPU-capable where it holds the gpu set, and on a machine without a
GPU it says so and trains on the CPU.

TensorFlow 2.21's Linux wheel is a CUDA 12 build; the lock adds the CUDA libraries as wheels
(`tensorflow[and-cuda]`), which TensorFlow finds through the RUNPATH of its own shared objects
(`$ORIGIN/../nvidia/<library>/lib`). Here they are loaded by name exactly the way the dynamic
loader would for TensorFlow, and asked for their versions. Without a GPU driver, the CUDA
runtime must report that there is no usable device rather than crash, and `fullthrottle run`'s
device line must say "no GPU" and why.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from tests.helpers import gpu_set_installed, needs_gpu_set
from trainer_module.training import hardware

GPUS = tf.config.list_physical_devices("GPU")
TENSORFLOW_OBJECTS = ("libtensorflow_framework.so.2", "libtensorflow_cc.so.2")

# soname -> the function that reports its version, and the major version TF was built against.
CUDA_LIBRARIES = {
    "libcudart.so.12": "cudaRuntimeGetVersion",
    "libcublas.so.12": None,
    "libcublasLt.so.12": None,
    "libcudnn.so.9": "cudnnGetVersion",
    "libcufft.so.11": None,
    "libcusparse.so.12": None,
    "libcusolver.so.11": None,
    "libnccl.so.2": None,
    "libcupti.so.12": None,
}


def _readelf_runpath(path: Path) -> list[str]:
    """RUNPATH as binutils' readelf prints it, $ORIGIN expanded (independent of the code)."""
    out = subprocess.run(
        ["readelf", "-d", str(path)], capture_output=True, text=True, check=True
    ).stdout
    entries = []
    for match in re.finditer(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", out):
        entries += match.group(1).split(":")
    origin = str(path.parent)
    return list(dict.fromkeys(os.path.normpath(e.replace("$ORIGIN", origin)) for e in entries))


def _tensorflow_library_dirs() -> list[str]:
    root = Path(tf.__file__).parent
    dirs = [d for name in TENSORFLOW_OBJECTS for d in _readelf_runpath(root / name)]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


needs_readelf = pytest.mark.skipif(
    shutil.which("readelf") is None, reason="binutils' readelf is not installed"
)


def test_tensorflow_is_a_cuda_12_build_with_cudnn_9():
    build = tf.sysconfig.get_build_info()
    assert build["is_cuda_build"] is True
    assert build["cuda_version"].startswith("12."), build
    assert str(build["cudnn_version"]).startswith("9"), build


@needs_readelf
def test_the_library_folders_are_tensorflow_s_runpath_after_ld_library_path():
    ld_library_path = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    expected = list(dict.fromkeys([*ld_library_path, *_tensorflow_library_dirs()]))
    assert hardware.tensorflow_library_dirs() == [d for d in expected if os.path.isdir(d)]
    root = Path(tf.__file__).parent
    for name in TENSORFLOW_OBJECTS:
        assert hardware.elf_runpath(str(root / name)) == _readelf_runpath(root / name)
    assert hardware.elf_runpath(__file__) == []  # not an ELF object: nothing, no error


@needs_readelf
@needs_gpu_set
def test_the_cuda_libraries_load_by_name_from_the_wheels_as_tensorflow_finds_them():
    dirs = _tensorflow_library_dirs()
    assert any("/nvidia/cudnn/lib" in d for d in dirs), dirs
    # A fresh process whose loader searches exactly TensorFlow's RUNPATH folders, as dlopen
    # does for a library TensorFlow asks for by name.
    probe = f"""
import ctypes, json
out = {{}}
for name, version_fn in {CUDA_LIBRARIES!r}.items():
    lib = ctypes.CDLL(name)
    if version_fn == "cudaRuntimeGetVersion":
        v = ctypes.c_int(); assert lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0; out[name] = v.value
        count = ctypes.c_int(-1); out["cudaGetDeviceCount"] = lib.cudaGetDeviceCount(ctypes.byref(count))
    elif version_fn == "cudnnGetVersion":
        lib.cudnnGetVersion.restype = ctypes.c_size_t; out[name] = lib.cudnnGetVersion()
    else:
        out[name] = "loaded"
print(json.dumps(out))
"""
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(dirs)}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    versions = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(versions) >= set(CUDA_LIBRARIES)
    assert 12000 <= versions["libcudart.so.12"] < 13000  # CUDA 12.x runtime
    assert 90000 <= versions["libcudnn.so.9"] < 100000  # cuDNN 9.x
    for name in CUDA_LIBRARIES:
        path = next((Path(d) / name for d in dirs if (Path(d) / name).exists()), None)
        assert path is not None and "site-packages/nvidia/" in str(path), name
    if not GPUS:
        # 35 = cudaErrorInsufficientDriver, 100 = cudaErrorNoDevice: an error, not a crash.
        assert versions["cudaGetDeviceCount"] in (35, 100), versions

    # What `doctor` reports (hardware.cuda_libraries, loaded in this process): the same files
    # and the same versions.
    reported = {lib.soname: lib for lib in hardware.cuda_libraries()}
    assert set(reported) == set(CUDA_LIBRARIES)
    for name, lib in reported.items():
        assert lib.loaded and lib.error is None, lib
        expected = next(str(Path(d) / name) for d in dirs if (Path(d) / name).exists())
        assert os.path.realpath(lib.path) == os.path.realpath(expected), lib
    runtime = versions["libcudart.so.12"]
    assert reported["libcudart.so.12"].version == f"{runtime // 1000}.{runtime % 1000 // 10}"
    cudnn = versions["libcudnn.so.9"]
    assert (
        reported["libcudnn.so.9"].version
        == f"{cudnn // 10000}.{cudnn % 10000 // 100}.{cudnn % 100}"
    )
    assert reported["libcublas.so.12"].version.startswith("12.")


def test_nvml_is_installed_and_says_when_there_is_no_driver():
    facts = hardware.nvml_facts()
    if not gpu_set_installed():
        # A CPU-only environment has no NVML binding: said, not raised.
        assert facts == hardware.NvmlFacts(
            error="nvidia-ml-py is not installed (pip install nvidia-ml-py)"
        )
        return
    import pynvml

    if GPUS:
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() >= len(GPUS)
        pynvml.nvmlShutdown()
        assert facts.error is None and len(facts.gpus) >= len(GPUS) and facts.driver_version
        return
    with pytest.raises(pynvml.NVMLError) as raised:
        pynvml.nvmlInit()
    assert raised.value.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    # The probe says the same, as a fact, without raising.
    assert facts == hardware.NvmlFacts(error=str(raised.value))


@pytest.mark.skipif(bool(GPUS), reason="this machine has a GPU")
def test_without_a_gpu_training_runs_on_the_cpu_and_says_why():
    assert hardware.tensorflow_gpus() == []
    line = hardware.device_summary([], logical_cpus=2)
    assert line == (
        "training on the CPU (2 logical devices): TensorFlow sees no GPU, "
        "no NVIDIA driver (libcuda.so.1 cannot be loaded)"
    )  # the reason on these machines


@pytest.mark.skipif(
    bool(GPUS) or os.path.exists(hardware.PROC_DRIVER_VERSION) or bool(glob.glob("/dev/nvidia*")),
    reason="this machine has an NVIDIA driver or device",
)
def test_the_gpu_environment_of_a_machine_without_a_driver():
    env = hardware.gpu_environment()
    assert env.is_cuda_build and env.cuda_version == tf.sysconfig.get_build_info()["cuda_version"]
    assert env.kernel_driver is None and env.device_nodes == ()
    assert "libcuda.so.1" in env.libcuda_error  # the loader's own message
    assert not env.driver_present
    # Without a driver the CUDA libraries are not even asked: the driver is the reason.
    assert env.missing_cuda_libraries == ()
