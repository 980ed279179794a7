"""Which GPUs TensorFlow sees in this process and, when it sees none, why, in words.

Owns the one sentence `fullthrottle run` and `fullthrottle gpu-check` print about GPUs. Reads
only what is cheap and certain: TensorFlow's build info, `CUDA_VISIBLE_DEVICES`, whether the
NVIDIA driver library loads, and the device nodes. The full diagnosis (driver version, CUDA
level, topology) is `fullthrottle doctor`'s.
"""

from __future__ import annotations

import ctypes
import glob
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    name: str  # TensorFlow's device name, e.g. /physical_device:GPU:0
    model: str  # e.g. "NVIDIA A100-SXM4-40GB" ("" when TensorFlow does not say)
    compute_capability: tuple[int, int] | None


def visible_gpus() -> list[GpuInfo]:
    """The GPUs TensorFlow sees (physical devices: listing them does not initialise the
    runtime, so logical devices can still be configured afterwards)."""
    import tensorflow as tf

    found = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        capability = details.get("compute_capability")
        found.append(
            GpuInfo(
                name=device.name,
                model=str(details.get("device_name", "")),
                compute_capability=tuple(capability) if capability else None,
            )
        )
    return found


def no_gpu_reason() -> str:
    """Why TensorFlow sees no GPU, most basic cause first, with what to do."""
    import tensorflow as tf

    build = tf.sysconfig.get_build_info()
    if not build.get("is_cuda_build"):
        return f"this TensorFlow {tf.__version__} is not a CUDA build"
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver (libcuda.so.1 cannot be loaded)"
    if not glob.glob("/dev/nvidia[0-9]*"):
        return "the NVIDIA driver library loads but there is no GPU device node (/dev/nvidia0)"
    return (
        "the NVIDIA driver loads and /dev/nvidia* exist, but TensorFlow found no usable GPU: "
        "check `nvidia-smi`; the CUDA 12 libraries need a driver of the 525 series or newer"
    )


def what_to_do_without_gpu() -> str:
    """Advice for someone who expected a GPU."""
    advice = "On a GPU machine, check that `nvidia-smi` lists the GPUs on the host"
    if os.environ.get("FULLTHROTTLE_ENV_DIR"):
        advice += (
            "; bin/envrun hands the host's driver to the environment when `ldconfig -p` lists "
            "libcuda.so.1 and /dev/nvidia0 exists, and then names the GPUs before each command"
        )
    return advice + "."


def device_summary(gpus: list[GpuInfo], *, logical_cpus: int = 0) -> str:
    """One line for people: where training will run."""
    if gpus:
        models = sorted({g.model for g in gpus if g.model})
        what = f" ({', '.join(models)})" if models else ""
        return f"TensorFlow sees {len(gpus)} GPU{'s' if len(gpus) > 1 else ''}{what}"
    cpus = f" ({logical_cpus} logical devices)" if logical_cpus > 1 else ""
    return f"training on the CPU{cpus}: TensorFlow sees no GPU, {no_gpu_reason()}"
