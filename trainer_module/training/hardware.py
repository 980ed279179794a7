"""What this machine can do for training: the one place that probes the hardware.

Owns: the CPU (model, feature flags, native bf16/AMX, usable cores), physical memory, the GPUs
TensorFlow sees (with their compute capabilities) and those the NVIDIA driver sees
(``nvidia-smi``), the GPU interconnect, NCCL, the CUDA/cuDNN versions TensorFlow was built
with, and the driver version each CUDA major needs. The precision policy, the step-time advisor
and ``fullthrottle doctor`` all ask here; new probes (e.g. NVML through ``nvidia-ml-py``) belong
here too.

Refuses nothing: a fact that cannot be read is reported as unknown (empty, None), never raised.
Reads happen when a function is called, never at import.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

CPUINFO = "/proc/cpuinfo"
# CPU flags (as /proc/cpuinfo spells them) with which oneDNN computes bfloat16 natively,
# accumulating in float32. Without one of them TensorFlow emulates bf16 (slower than float32).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# CPU flags that matter for TensorFlow's speed (what `doctor` reports).
CPU_FLAGS_OF_INTEREST = (
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# Tensor cores (fast float16 matmuls) from this compute capability on.
TENSOR_CORE_CAPABILITY = (7, 0)
# Minimum Linux driver for a CUDA major version (NVIDIA's CUDA compatibility table).
MIN_DRIVER_FOR_CUDA = {11: (450, 80), 12: (525, 60), 13: (580, 0)}


# --- CPU and memory ---------------------------------------------------------------------------
@dataclass(frozen=True)
class CpuInfo:
    """The CPU as /proc/cpuinfo and the scheduler describe it."""

    model: str | None
    flags: frozenset[str]
    logical_cores: int | None  # os.cpu_count()
    usable_cores: int  # cores this process may run on (its affinity mask)
    readable: bool  # False when /proc/cpuinfo could not be read: flags are then unknown

    @property
    def native_bf16_flags(self) -> tuple[str, ...]:
        return tuple(flag for flag in BF16_CPU_FLAGS if flag in self.flags)

    @property
    def native_bf16(self) -> bool:
        return bool(self.native_bf16_flags)

    @property
    def amx(self) -> bool:
        return "amx_tile" in self.flags


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def usable_cpu_count() -> int:
    """Cores this process may run on (its affinity mask; all cores where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_info(cpuinfo_path: str = CPUINFO) -> CpuInfo:
    """Model and feature flags of the first processor in ``cpuinfo_path``, and the core counts."""
    text = _read(cpuinfo_path)
    model = None
    flags: frozenset[str] = frozenset()
    for line in text.splitlines():
        if model is None and line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
        elif not flags and line.startswith("flags"):
            flags = frozenset(line.split(":", 1)[1].split())
    return CpuInfo(
        model=model,
        flags=flags,
        logical_cores=os.cpu_count(),
        usable_cores=usable_cpu_count(),
        readable=bool(text),
    )


def cpu_flags(cpuinfo_path: str = CPUINFO) -> frozenset[str]:
    """The CPU feature flags of the first processor (empty if unreadable)."""
    return cpu_info(cpuinfo_path).flags


def cpu_has_native_bf16(cpuinfo_path: str = CPUINFO) -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512_BF16 or AMX-BF16)."""
    return cpu_info(cpuinfo_path).native_bf16


def physical_memory_bytes() -> int:
    """Physical RAM in bytes (0 if unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return 0


# --- GPUs, as TensorFlow and the driver see them -----------------------------------------------
@dataclass(frozen=True)
class TensorFlowGpu:
    name: str  # TensorFlow's device name, e.g. /physical_device:GPU:0
    device_name: str | None  # the product, e.g. "Tesla V100-SXM2-16GB"
    compute_capability: tuple[int, int] | None


def tensorflow_gpus() -> list[TensorFlowGpu]:
    """The GPUs TensorFlow can use (none without a CUDA build and its libraries)."""
    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        capability = details.get("compute_capability")
        gpus.append(
            TensorFlowGpu(
                name=device.name,
                device_name=details.get("device_name"),
                compute_capability=tuple(capability) if capability else None,
            )
        )
    return gpus


def gpu_compute_capabilities() -> list[tuple[int, int]]:
    """The compute capability of each GPU TensorFlow sees ((0, 0) where it is unknown)."""
    return [gpu.compute_capability or (0, 0) for gpu in tensorflow_gpus()]


def tensorflow_build() -> dict[str, Any]:
    """What this TensorFlow was built with: CUDA, cuDNN and the compute capabilities it has
    kernels for (a CPU-only build has none)."""
    build = dict(tf.sysconfig.get_build_info())
    return {
        "is_cuda_build": bool(build.get("is_cuda_build")),
        "cuda_version": build.get("cuda_version"),
        "cudnn_version": build.get("cudnn_version"),
        "cuda_compute_capabilities": list(build.get("cuda_compute_capabilities") or []),
    }


def _nvidia_smi(*args: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def smi_gpus() -> list[dict[str, Any]]:
    """GPUs as the driver sees them (nvidia-smi), whether or not TensorFlow can use them."""
    out = _nvidia_smi(
        "--query-gpu=index,name,memory.total,driver_version,compute_cap",
        "--format=csv,noheader,nounits",
    )
    gpus = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5:
            gpus.append(
                {
                    "index": parts[0],
                    "name": parts[1],
                    "memory_mib": int(parts[2]) if parts[2].isdigit() else None,
                    "driver": parts[3],
                    "compute_capability": parts[4],
                }
            )
    return gpus


def interconnect(gpu_count: int) -> dict[str, Any] | None:
    """NVLink or PCIe between GPUs, from `nvidia-smi topo -m` (only asked with several GPUs)."""
    if gpu_count < 2:
        return None
    out = _nvidia_smi("topo", "-m")
    if out is None:
        return {"kind": "unknown", "detail": "nvidia-smi topo -m is not available"}
    rows = [line.split() for line in out.splitlines() if line.startswith("GPU")]
    links = {cell for row in rows for cell in row[1 : gpu_count + 1] if cell != "X"}
    nvlink = sorted(cell for cell in links if cell.startswith("NV"))
    if nvlink:
        return {"kind": "NVLink", "detail": f"links {', '.join(nvlink)} between GPUs"}
    return {"kind": "PCIe", "detail": f"paths {', '.join(sorted(links)) or '?'} (no NVLink)"}


def nccl() -> dict[str, Any]:
    """NCCL's version when its library loads (pip's nvidia-nccl-cu* or a system copy)."""
    candidates = []
    for dist in ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11"):
        try:
            files = importlib.metadata.files(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        candidates += [str(f.locate()) for f in files if f.name.startswith("libnccl.so")]
    system = ctypes.util.find_library("nccl")
    if system:
        candidates.append(system)
    for path in candidates:
        try:
            library = ctypes.CDLL(path)
            version = ctypes.c_int()
            if library.ncclGetVersion(ctypes.byref(version)) == 0:
                code = version.value  # major*10000 + minor*100 + patch (NCCL >= 2.9)
                return {
                    "available": True,
                    "version": f"{code // 10000}.{code % 10000 // 100}.{code % 100}",
                    "path": path,
                }
        except (OSError, AttributeError):
            continue
    return {"available": False, "version": None, "path": None}


def driver_too_old(driver: str, cuda_version: str | None) -> str | None:
    """The minimum driver ("525.60") when ``driver`` is too old for ``cuda_version``'s major;
    None when it is new enough or either version is unknown or unreadable."""
    if not cuda_version:
        return None
    try:
        major = int(cuda_version.split(".")[0])
        have = tuple(int(x) for x in driver.split(".")[:2])
    except ValueError:
        return None
    need = MIN_DRIVER_FOR_CUDA.get(major)
    if need and have < need:
        return f"{need[0]}.{need[1]}"
    return None


# --- the facts training decisions depend on ------------------------------------------------------
@dataclass(frozen=True)
class DeviceFacts:
    """What the training device can do (only what precision and the advisor depend on)."""

    cpu_flags: frozenset[str] = frozenset()
    cpu_count: int = 1
    gpu_compute_capabilities: tuple[tuple[int, int], ...] = ()

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu_compute_capabilities)

    @property
    def cpu_bf16(self) -> bool:
        return bool(set(BF16_CPU_FLAGS) & self.cpu_flags)

    @property
    def gpu_float16(self) -> bool:
        """Every GPU has tensor cores."""
        return self.has_gpu and min(self.gpu_compute_capabilities) >= TENSOR_CORE_CAPABILITY

    def describe(self) -> dict[str, Any]:
        return {
            "cpu_count": self.cpu_count,
            "cpu_bf16": self.cpu_bf16,
            "gpu_compute_capabilities": [list(c) for c in self.gpu_compute_capabilities],
        }


def device_facts(cpuinfo_path: str = CPUINFO) -> DeviceFacts:
    """This machine's facts: CPU flags and usable cores, GPUs from TensorFlow."""
    return DeviceFacts(
        cpu_flags=cpu_flags(cpuinfo_path),
        cpu_count=usable_cpu_count(),
        gpu_compute_capabilities=tuple(gpu_compute_capabilities()),
    )
