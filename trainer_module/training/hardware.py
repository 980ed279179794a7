"""What this machine can do for training: the one place that probes the hardware.

Owns: the CPU (model, feature flags, native bf16/AMX, usable cores), physical memory, the GPUs
TensorFlow sees (with their compute capabilities) and why it sees none, the CUDA/cuDNN versions
TensorFlow was built with and whether its CUDA libraries load, the NVIDIA driver as this
environment sees it (kernel module, device nodes, libcuda) and as NVML describes it (driver
version and CUDA level, each GPU's name, memory, compute capability and NVLink/PCIe links),
NCCL, and the driver version each CUDA major needs. The precision policy, the step-time
advisor, `fullthrottle run`'s device line, `gpu-check` and `fullthrottle doctor` all ask here.

Decisions are pure functions of facts (``no_gpu_reason``, ``gpu_links``, ``kernel_support``,
``driver_too_old``), so they are tested on recorded or composed facts; the probes that read
the facts are separate. Refuses nothing: a fact that cannot be read is reported as unknown
(empty, None, or an ``error`` saying why), never raised. Reads happen when a function is
called, never at import. NVML comes through ``nvidia-ml-py``, imported inside ``nvml_facts``
only: the one import here besides TensorFlow and the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import importlib.metadata
import mmap
import os
import re
import struct
from collections.abc import Sequence
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


# --- GPUs, as TensorFlow sees them -------------------------------------------------------------
@dataclass(frozen=True)
class TensorFlowGpu:
    name: str  # TensorFlow's device name, e.g. /physical_device:GPU:0
    device_name: str | None  # the product, e.g. "Tesla V100-SXM2-16GB"
    compute_capability: tuple[int, int] | None


def tensorflow_gpus() -> list[TensorFlowGpu]:
    """The GPUs TensorFlow can use (none without a CUDA build and its libraries). Lists physical
    devices only, which does not initialise the runtime: logical devices and memory growth can
    still be configured afterwards."""
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


def _build_capabilities(build_capabilities: Sequence[str]) -> tuple[list, list]:
    """(machine-code, PTX) capabilities of a build's list ("sm_80", "compute_90")."""
    machine_code, ptx = [], []
    for entry in build_capabilities:
        kind, _, digits = entry.partition("_")
        if len(digits) >= 2 and digits.isdigit():
            version = (int(digits[:-1]), int(digits[-1]))
            (machine_code if kind == "sm" else ptx).append(version)
    return machine_code, ptx


def lowest_capability(build_capabilities: Sequence[str]) -> tuple[int, int] | None:
    """The oldest GPU (compute capability) the build has kernels for."""
    machine_code, ptx = _build_capabilities(build_capabilities)
    return min(machine_code + ptx, default=None)


def kernel_support(capability: tuple[int, int], build_capabilities: Sequence[str]) -> str:
    """How this TensorFlow build runs its kernels on a GPU of ``capability``, from the build's
    list (``sm_80`` = machine code for 8.x GPUs from 8.0 on, ``compute_90`` = PTX for 9.0 and
    newer): "native" (machine code), "ptx" (the driver compiles the PTX at the first start) or
    "none" (TensorFlow ignores the GPU)."""
    machine_code, ptx = _build_capabilities(build_capabilities)
    if any(major == capability[0] and minor <= capability[1] for major, minor in machine_code):
        return "native"
    if any(version <= capability for version in ptx):
        return "ptx"
    return "none"


# --- the CUDA libraries TensorFlow loads --------------------------------------------------------
# The libraries a CUDA build of TensorFlow opens by name at run time, per CUDA major version:
# for CUDA 12 the sonames of the `tensorflow[and-cuda]` wheels. The driver's own libcuda.so.1 is
# not among them: it comes from the NVIDIA driver (see `GpuEnvironment`).
CUDA_LIBRARIES = {
    12: (
        "libcudart.so.12",
        "libcublas.so.12",
        "libcublasLt.so.12",
        "libcudnn.so.9",
        "libcufft.so.11",
        "libcusparse.so.12",
        "libcusolver.so.11",
        "libnccl.so.2",
        "libcupti.so.12",
    ),
}
_TENSORFLOW_SHARED_OBJECTS = ("libtensorflow_framework.so.2", "libtensorflow_cc.so.2")


def elf_runpath(path: str) -> list[str]:
    """The DT_RUNPATH (or DT_RPATH) folders of a 64-bit little-endian ELF shared object, with
    ``$ORIGIN`` expanded; empty when the file cannot be read or is not such an object. Maps the
    file rather than reading it: TensorFlow's objects are hundreds of MB, the headers a few kB."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
                return []
            (section_offset,) = struct.unpack_from("<Q", data, 0x28)
            entry_size, count = struct.unpack_from("<HH", data, 0x3A)
            sections = [
                struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size)
                for i in range(count)
            ]
            dynamic = next((s for s in sections if s[1] == 6), None)  # SHT_DYNAMIC
            if dynamic is None:
                return []
            strings = sections[dynamic[6]]  # sh_link: the dynamic section's string table
            entries: list[str] = []
            for offset in range(dynamic[4], dynamic[4] + dynamic[5], 16):
                tag, value = struct.unpack_from("<qQ", data, offset)
                if tag == 0:  # DT_NULL
                    break
                if tag in (29, 15):  # DT_RUNPATH, DT_RPATH
                    start = strings[4] + value
                    entries += data[start : data.find(b"\0", start)].decode().split(":")
    except (OSError, struct.error, ValueError, IndexError, UnicodeDecodeError):
        return []
    origin = os.path.dirname(os.path.abspath(path))
    return list(dict.fromkeys(os.path.normpath(e.replace("$ORIGIN", origin)) for e in entries))


def tensorflow_library_dirs() -> list[str]:
    """The folders the dynamic loader searches, in its order, for a library TensorFlow opens by
    name: ``LD_LIBRARY_PATH``, then the RUNPATH of TensorFlow's own shared objects (where the
    `tensorflow[and-cuda]` wheels put the CUDA libraries). Existing folders only."""
    root = os.path.dirname(tf.__file__)
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for name in _TENSORFLOW_SHARED_OBJECTS:
        dirs += elf_runpath(os.path.join(root, name))
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


@dataclass(frozen=True)
class CudaLibrary:
    soname: str  # e.g. libcudnn.so.9
    path: str | None  # the file that loaded (the bare soname when the loader's cache found it)
    version: str | None  # asked of the runtime, cuBLAS and cuDNN
    error: str | None  # why it does not load; None when it loads

    @property
    def loaded(self) -> bool:
        return self.error is None


def _library_version(soname: str, library: ctypes.CDLL) -> str | None:
    """The version the library reports itself (None for those not asked, or on failure)."""
    try:
        if soname.startswith("libcudart."):
            code = ctypes.c_int()
            if library.cudaRuntimeGetVersion(ctypes.byref(code)) == 0:
                return f"{code.value // 1000}.{code.value % 1000 // 10}"  # 12090 -> 12.9
        elif soname.startswith("libcudnn."):
            library.cudnnGetVersion.restype = ctypes.c_size_t
            code = library.cudnnGetVersion()  # major*10000 + minor*100 + patch (cuDNN >= 9)
            return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
        elif soname.startswith("libcublas."):
            parts = []
            for prop in (0, 1, 2):  # libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
                value = ctypes.c_int()
                if library.cublasGetProperty(prop, ctypes.byref(value)) != 0:
                    return None
                parts.append(str(value.value))
            return ".".join(parts)
    except (AttributeError, OSError):
        return None
    return None


def cuda_libraries(build: dict[str, Any] | None = None) -> list[CudaLibrary]:
    """Loads each CUDA library of this TensorFlow build the way the loader finds it for
    TensorFlow (`tensorflow_library_dirs`, then the loader's cache) and asks the runtime, cuBLAS
    and cuDNN for their versions. Loading needs no driver. Empty for a build without CUDA, or of
    a CUDA major version `CUDA_LIBRARIES` has no list for."""
    build = build or tensorflow_build()
    if not build["is_cuda_build"]:
        return []
    try:
        major = int(str(build["cuda_version"]).split(".")[0])
    except ValueError:
        return []
    dirs = tensorflow_library_dirs()
    found = []
    for soname in CUDA_LIBRARIES.get(major, ()):
        path = next(
            (os.path.join(d, soname) for d in dirs if os.path.exists(os.path.join(d, soname))),
            soname,
        )
        try:
            library = ctypes.CDLL(path)
        except OSError as exc:
            found.append(CudaLibrary(soname=soname, path=None, version=None, error=str(exc)))
            continue
        found.append(
            CudaLibrary(
                soname=soname, path=path, version=_library_version(soname, library), error=None
            )
        )
    return found


# --- the NVIDIA driver, as this environment sees it ----------------------------------------------
PROC_DRIVER_VERSION = "/proc/driver/nvidia/version"
# The driver's CUDA library: TensorFlow (and every CUDA program) needs it, the wheels cannot
# bring it (it must match the kernel module).
LIBCUDA = "libcuda.so.1"


@dataclass(frozen=True)
class GpuEnvironment:
    """What decides whether TensorFlow can reach a GPU from this process, read without asking
    TensorFlow (see `gpu_environment`)."""

    is_cuda_build: bool
    cuda_version: str | None  # of TensorFlow's build
    cuda_visible_devices: str | None  # the variable as set (None: unset)
    # The loaded NVIDIA kernel module's version, from /proc/driver/nvidia/version. /proc shows
    # the host's module even inside a chroot or container that was given no GPU.
    kernel_driver: str | None
    device_nodes: tuple[str, ...]  # /dev/nvidia0, /dev/nvidia1, ... in this environment
    libcuda_error: str | None  # why libcuda.so.1 does not load; None when it loads
    missing_cuda_libraries: tuple[str, ...] = ()  # CUDA libraries of the build that do not load

    @property
    def driver_present(self) -> bool:
        """Any sign of an NVIDIA driver: its kernel module, a GPU device node or libcuda."""
        return bool(self.kernel_driver or self.device_nodes or self.libcuda_error is None)


def kernel_driver_version(text: str) -> str | None:
    """The version in /proc/driver/nvidia/version's first line ("NVRM version: NVIDIA UNIX x86_64
    Kernel Module  550.54.15  Tue Mar ..." or "... Open Kernel Module for x86_64  570.86.15 ...")."""
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            match = re.search(r"(?<![\w.])(\d+\.\d+(?:\.\d+)?)(?![\w.])", line)
            return match.group(1) if match else None
    return None


def gpu_environment(
    *,
    libraries: Sequence[CudaLibrary] | None = None,
    proc_driver_version: str = PROC_DRIVER_VERSION,
    dev_dir: str = "/dev",
) -> GpuEnvironment:
    """Reads the GPU environment of this process. The CUDA libraries are taken from
    ``libraries`` when given; otherwise they are loaded only when a driver and a device node are
    there (before that, a missing driver or device is the reason TensorFlow sees no GPU)."""
    build = tensorflow_build()
    try:
        ctypes.CDLL(LIBCUDA)
        libcuda_error = None
    except OSError as exc:
        libcuda_error = str(exc)
    nodes = tuple(
        sorted(
            glob.glob(os.path.join(dev_dir, "nvidia[0-9]*")),
            key=lambda p: int(re.sub(r"\D", "", os.path.basename(p)) or 0),
        )
    )
    if libraries is None:
        libraries = cuda_libraries(build) if libcuda_error is None and nodes else []
    return GpuEnvironment(
        is_cuda_build=build["is_cuda_build"],
        cuda_version=build["cuda_version"],
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        kernel_driver=kernel_driver_version(_read(proc_driver_version)),
        device_nodes=nodes,
        libcuda_error=libcuda_error,
        missing_cuda_libraries=tuple(lib.soname for lib in libraries if not lib.loaded),
    )


def missing_libraries_advice(missing: Sequence[str]) -> str:
    """What to say when CUDA libraries of the build do not load."""
    return (
        f"TensorFlow's CUDA libraries do not load ({', '.join(missing)}): the environment lacks "
        "the `tensorflow[and-cuda]` wheels (requirements-gpu.lock); bin/envrun installs them where "
        "it finds an NVIDIA driver, FULLTHROTTLE_ENV_GPU=1 asks for them anyway, and it rebuilds "
        "a deleted or incomplete environment; in a venv of your own, pip install '.[gpu]'"
    )


def no_gpu_reason(env: GpuEnvironment) -> str:
    """Why TensorFlow sees no GPU, most basic cause first, with what to do."""
    if not env.is_cuda_build:
        return "this TensorFlow is not a CUDA build (the lock's `tensorflow[and-cuda]` is)"
    hidden = env.cuda_visible_devices
    if hidden is not None and hidden.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU (unset it to use them)"
    nodes = " ".join(env.device_nodes)
    if env.libcuda_error is not None and not env.device_nodes:
        if env.kernel_driver:
            return (
                f"the NVIDIA driver {env.kernel_driver} is loaded on this machine "
                f"({PROC_DRIVER_VERSION}) but neither a GPU device node (/dev/nvidia0) nor the "
                f"driver's {LIBCUDA} is in this environment: the GPUs were not handed to it "
                f"(bin/envrun hands them over when the host has /dev/nvidia0 and `ldconfig -p` "
                f"lists {LIBCUDA}; a container needs `--gpus all` and NVIDIA's container toolkit)"
            )
        return f"no NVIDIA driver ({LIBCUDA} cannot be loaded)"
    if not env.device_nodes:
        if env.kernel_driver:
            return (
                f"the NVIDIA driver {env.kernel_driver} is loaded and {LIBCUDA} loads, but "
                "there is no GPU device node (/dev/nvidia0) in this environment: create the "
                "nodes on the host (`nvidia-smi` as root does) or, in a container, pass the "
                "GPUs in (`--gpus all`)"
            )
        return (
            f"the NVIDIA driver library loads but there is no GPU device node (/dev/nvidia0) "
            f"and no NVIDIA kernel module ({PROC_DRIVER_VERSION}): the driver is not loaded or "
            "this machine has no GPU (check `nvidia-smi` on the host)"
        )
    if env.libcuda_error is not None:
        return (
            f"{nodes} exist but the driver's {LIBCUDA} cannot be loaded ({env.libcuda_error}): "
            "the driver's user-space libraries are not in this environment (bin/envrun hands "
            f"them over when the host's `ldconfig -p` lists {LIBCUDA}: install them or run "
            "ldconfig on the host; a container needs NVIDIA's container toolkit)"
        )
    need = driver_too_old(env.kernel_driver or "", env.cuda_version)
    if need:
        return (
            f"the NVIDIA driver {env.kernel_driver} is older than {need}, the minimum for the "
            f"CUDA {env.cuda_version} this TensorFlow was built with: update the driver"
        )
    if env.missing_cuda_libraries:
        return missing_libraries_advice(env.missing_cuda_libraries)
    return (
        f"the NVIDIA driver loads and {nodes} exist, but TensorFlow found no usable GPU: "
        "`fullthrottle doctor` compares each GPU's compute capability and the driver's CUDA "
        "level with this TensorFlow build (`--verbose` shows TensorFlow's own log)"
    )


def why_no_gpu() -> str:
    """`no_gpu_reason` for this process."""
    return no_gpu_reason(gpu_environment())


def what_to_do_without_gpu() -> str:
    """Advice for someone who expected a GPU."""
    advice = "On a GPU machine, check that `nvidia-smi` lists the GPUs on the host"
    if os.environ.get("FULLTHROTTLE_ENV_DIR"):
        advice += (
            "; bin/envrun hands the host's driver to the environment when `ldconfig -p` lists "
            "libcuda.so.1 and /dev/nvidia0 exists, and then names the GPUs before each command"
        )
    return advice + "; `fullthrottle doctor` says what is missing."


def device_summary(
    gpus: Sequence[TensorFlowGpu], *, logical_cpus: int = 0, reason: str | None = None
) -> str:
    """One line for people: where training will run. Without GPUs it says why (``reason``, read
    from this process when not given)."""
    if gpus:
        models = sorted({g.device_name for g in gpus if g.device_name})
        what = f" ({', '.join(models)})" if models else ""
        return f"TensorFlow sees {len(gpus)} GPU{'s' if len(gpus) > 1 else ''}{what}"
    cpus = f" ({logical_cpus} logical devices)" if logical_cpus > 1 else ""
    return f"training on the CPU{cpus}: TensorFlow sees no GPU, {reason or why_no_gpu()}"


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


def cuda_level_below(level: str | None, cuda_version: str | None) -> bool:
    """Whether the driver's CUDA level ("12.2") is below the major.minor of ``cuda_version``
    ("12.5.1"): the build still runs (CUDA's minor-version compatibility), but PTX compiled
    with the newer CUDA cannot be compiled by this driver."""
    try:
        have = tuple(int(x) for x in (level or "").split(".")[:2])
        need = tuple(int(x) for x in (cuda_version or "").split(".")[:2])
    except ValueError:
        return False
    return len(have) == 2 and len(need) == 2 and have < need


# --- GPUs and their links, as the driver sees them (NVML) ----------------------------------------
@dataclass(frozen=True)
class NvmlGpu:
    index: int
    name: str | None
    memory_mib: int | None
    compute_capability: tuple[int, int] | None
    pci_bus_id: str | None
    nvlink_peers: tuple[str, ...] = ()  # PCI bus id of the GPU at the end of each active NVLink
    nvswitch_links: int = 0  # active NVLinks to an NVSwitch


@dataclass(frozen=True)
class NvmlFacts:
    """What the NVIDIA driver says through NVML (``nvidia-ml-py``); ``error`` says why it said
    nothing (e.g. "NVML Shared Library Not Found": no driver in this environment)."""

    error: str | None
    driver_version: str | None = None
    cuda_level: str | None = None  # the newest CUDA this driver supports, e.g. "12.4"
    gpus: tuple[NvmlGpu, ...] = ()
    # NVML's common PCIe ancestor of each pair of GPUs (index, index, NVML_TOPOLOGY_* level).
    topology: tuple[tuple[int, int, int], ...] = ()


def cuda_level(code: int) -> str:
    """NVML's and CUDA's version number as "major.minor" (12040 -> "12.4")."""
    return f"{code // 1000}.{code % 1000 // 10}"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def nvml_facts() -> NvmlFacts:
    """Driver version, its CUDA level, and each GPU's name, memory, compute capability, PCI
    address, NVLinks and the PCIe path between each pair, from NVML. Never raises: what NVML
    cannot answer is None (a query a GPU does not support) or ``error`` (NVML does not start)."""
    try:
        # Imported here, not with this module: nvidia-ml-py is a ctypes binding of the driver's
        # libnvidia-ml.so.1, needed only to describe GPUs (the import-linter contract names
        # this one exception to "TensorFlow and Keras only").
        import pynvml
    except ImportError:
        return NvmlFacts(error="nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return NvmlFacts(error=str(exc))
    try:
        return _read_nvml(pynvml)
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _read_nvml(pynvml: Any) -> NvmlFacts:
    def ask(function: Any, *args: Any) -> Any:
        try:
            return function(*args)
        except pynvml.NVMLError:  # e.g. NotSupported: that fact stays unknown
            return None

    handles = [
        ask(pynvml.nvmlDeviceGetHandleByIndex, i)
        for i in range(ask(pynvml.nvmlDeviceGetCount) or 0)
    ]
    gpus = []
    for index, handle in enumerate(handles):
        if handle is None:
            continue
        memory = ask(pynvml.nvmlDeviceGetMemoryInfo, handle)
        capability = ask(pynvml.nvmlDeviceGetCudaComputeCapability, handle)
        pci = ask(pynvml.nvmlDeviceGetPciInfo, handle)
        peers, switch_links = [], 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            # NotSupported (a GPU without NVLink) or InvalidArgument (past its last link): None.
            if ask(pynvml.nvmlDeviceGetNvLinkState, handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote_type = ask(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            if remote_type == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switch_links += 1
                continue
            remote = ask(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if remote is not None:
                peers.append(_text(remote.busId) or "")
        gpus.append(
            NvmlGpu(
                index=index,
                name=_text(ask(pynvml.nvmlDeviceGetName, handle)),
                memory_mib=int(memory.total) // 2**20 if memory is not None else None,
                compute_capability=tuple(capability) if capability else None,
                pci_bus_id=_text(pci.busId) if pci is not None else None,
                nvlink_peers=tuple(peers),
                nvswitch_links=switch_links,
            )
        )
    topology = []
    for a in range(len(handles)):
        for b in range(a + 1, len(handles)):
            if handles[a] is not None and handles[b] is not None:
                level = ask(pynvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
                if level is not None:
                    topology.append((a, b, int(level)))
    code = ask(pynvml.nvmlSystemGetCudaDriverVersion)
    return NvmlFacts(
        error=None,
        driver_version=_text(ask(pynvml.nvmlSystemGetDriverVersion)),
        cuda_level=cuda_level(code) if code else None,
        gpus=tuple(gpus),
        topology=tuple(topology),
    )


# NVML's common-ancestor levels (NVML_TOPOLOGY_*) with the names `nvidia-smi topo -m` gives
# them: how far apart two GPUs are on PCIe, nearest first.
PCIE_PATHS = {
    0: ("board", "on one board"),
    10: ("PIX", "through one PCIe switch"),
    20: ("PXB", "through several PCIe switches"),
    30: ("PHB", "through a CPU's PCIe host bridge"),
    40: ("NODE", "between PCIe host bridges of one NUMA node"),
    50: ("SYS", "across CPU sockets (QPI/UPI)"),
}


@dataclass(frozen=True)
class GpuLink:
    gpus: tuple[int, int]
    kind: str  # "NVLink", "PCIe" or "unknown"
    label: str  # as `nvidia-smi topo -m` shows it: NV12, NVSwitch, PIX, PXB, PHB, NODE, SYS
    detail: str


def _bus(bus_id: str | None) -> tuple[int, ...] | None:
    """A PCI address ("00000000:07:00.0") as numbers, so that NVML's differently padded forms
    of one address compare equal."""
    if not bus_id:
        return None
    try:
        return tuple(int(part, 16) for part in re.split(r"[:.]", bus_id.strip()))
    except ValueError:
        return None


def gpu_links(nvml: NvmlFacts) -> list[GpuLink]:
    """How each pair of GPUs is connected: NVLink (direct, or both through NVSwitches), else
    the PCIe path between them."""
    gpus = {gpu.index: gpu for gpu in nvml.gpus}
    links = []
    for a, b, level in nvml.topology:
        first, second = gpus.get(a), gpus.get(b)
        if first is None or second is None:
            continue
        direct = sum(1 for peer in first.nvlink_peers if _bus(peer) == _bus(second.pci_bus_id))
        if direct:
            plural = "s" if direct > 1 else ""
            links.append(GpuLink((a, b), "NVLink", f"NV{direct}", f"{direct} NVLink{plural}"))
        elif first.nvswitch_links and second.nvswitch_links:
            links.append(GpuLink((a, b), "NVLink", "NVSwitch", "NVLink through NVSwitch"))
        elif level in PCIE_PATHS:
            label, words = PCIE_PATHS[level]
            links.append(GpuLink((a, b), "PCIe", label, f"PCIe {words}"))
        else:
            links.append(GpuLink((a, b), "unknown", "?", f"NVML topology level {level}"))
    return links


def interconnect_summary(links: Sequence[GpuLink]) -> dict[str, Any] | None:
    """One verdict for all pairs (None with fewer than two GPUs): "NVLink" when every pair has
    it, "PCIe" when none has, "mixed" otherwise; ``detail`` counts the pairs per kind of link."""
    if not links:
        return None
    kinds = {link.kind for link in links}
    kind = kinds.pop() if len(kinds) == 1 else "mixed"
    counts: dict[str, int] = {}
    for link in links:
        counts[link.detail] = counts.get(link.detail, 0) + 1
    detail = ", ".join(
        f"{what} ({count} pair{'s' if count > 1 else ''})" for what, count in counts.items()
    )
    return {
        "kind": kind,
        "detail": detail,
        "pairs": [
            {"gpus": list(link.gpus), "kind": link.kind, "label": link.label} for link in links
        ],
    }


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
