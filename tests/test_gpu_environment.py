"""The locked environment is GPU-capable, and on a machine without a GPU it says so and trains on
the CPU.

TensorFlow 2.21's Linux wheel is a CUDA 12 build; the lock adds the CUDA libraries as wheels
(`tensorflow[and-cuda]`), which TensorFlow finds through the RUNPATH of its own shared objects
(`$ORIGIN/../nvidia/<library>/lib`). Here they are loaded by name exactly the way the dynamic
loader would for TensorFlow, and asked for their versions. Without a GPU driver, the CUDA
runtime must report that there is no usable device rather than crash, and `fullthrottle run`'s
device line must say "no GPU" and why.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from fullthrottle.core.gpu import device_summary, visible_gpus

GPUS = tf.config.list_physical_devices("GPU")

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


def _runpath(path: Path) -> list[str]:
    """DT_RUNPATH (or DT_RPATH) of a 64-bit little-endian ELF shared object, $ORIGIN expanded."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path}: not ELF64 LE"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    dynamic = next(s for s in sections if s[1] == 6)  # SHT_DYNAMIC
    strtab = sections[dynamic[6]]  # sh_link: its string table
    entries = []
    for offset in range(dynamic[4], dynamic[4] + dynamic[5], 16):
        tag, value = struct.unpack_from("<qQ", data, offset)
        if tag == 0:
            break
        if tag in (29, 15):  # DT_RUNPATH, DT_RPATH
            end = data.index(b"\0", strtab[4] + value)
            entries += data[strtab[4] + value : end].decode().split(":")
    origin = str(path.parent)
    return list(dict.fromkeys(os.path.normpath(e.replace("$ORIGIN", origin)) for e in entries))


def _tensorflow_library_dirs() -> list[str]:
    root = Path(tf.__file__).parent
    dirs = _runpath(root / "libtensorflow_framework.so.2") + _runpath(
        root / "libtensorflow_cc.so.2"
    )
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def test_tensorflow_is_a_cuda_12_build_with_cudnn_9():
    build = tf.sysconfig.get_build_info()
    assert build["is_cuda_build"] is True
    assert build["cuda_version"].startswith("12."), build
    assert str(build["cudnn_version"]).startswith("9"), build


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


def test_nvml_is_installed_and_says_when_there_is_no_driver():
    import pynvml

    if GPUS:
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() >= len(GPUS)
        pynvml.nvmlShutdown()
        return
    with pytest.raises(pynvml.NVMLError) as raised:
        pynvml.nvmlInit()
    assert raised.value.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND


@pytest.mark.skipif(bool(GPUS), reason="this machine has a GPU")
def test_without_a_gpu_training_runs_on_the_cpu_and_says_why():
    assert visible_gpus() == []
    line = device_summary([], logical_cpus=2)
    assert line.startswith("training on the CPU (2 logical devices): TensorFlow sees no GPU, ")
    assert "libcuda.so.1" in line  # the reason: no NVIDIA driver here
