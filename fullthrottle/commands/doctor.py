"""`fullthrottle doctor`: is this machine set up to train fast, and what would `auto` pick here?

Owns: collecting facts (versions, CPU features, memory, GPUs, NCCL, CUDA/cuDNN of the TF build,
GPU interconnect), asking the training library what `precision: auto` and `strategy: auto`
resolve to for the given config, and turning known pitfalls into warnings. Refuses nothing: a
fact that cannot be read is reported as unknown, never raised; only a bad `--config`/`--set` is
an error. It never builds a multi-worker strategy (that would wait for the other workers).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

from fullthrottle.commands.options import add_config_arguments, config_from_args

PACKAGES = (
    ("tensorflow", "TensorFlow"),
    ("keras", "Keras"),
    ("tfx", "TFX"),
    ("apache-beam", "Apache Beam"),
    ("mlflow", "MLflow"),
    ("ml-metadata", "ML Metadata"),
    ("tensorflow-transform", "TF Transform"),
    ("kfp", "KFP"),
)
# CPU flags (as /proc/cpuinfo spells them) that matter for TensorFlow's speed.
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
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# Minimum Linux driver for a CUDA major version (NVIDIA's CUDA compatibility table).
MIN_DRIVER_FOR_CUDA = {11: (450, 80), 12: (525, 60), 13: (580, 0)}


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "doctor",
        help="check this machine: versions, CPU/GPU features, what `auto` picks, known pitfalls",
        description=(
            "Reports the versions of the stack, the CPU's features (AVX-512, BF16, AMX), GPUs "
            "(compute capability, memory, driver, interconnect), NCCL, the CUDA/cuDNN versions "
            "TensorFlow was built with, the precision policy and distribution strategy `auto` "
            "would pick for your config and why, and warnings for known pitfalls."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle doctor\n"
            "  fullthrottle doctor --preset multi_gpu\n"
            "  fullthrottle doctor --config my.yaml --json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # The same --config/--preset/--set as every command: `auto` is resolved for that config.
    add_config_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


# --- facts -----------------------------------------------------------------------------------
def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cpu_facts(cpuinfo_path: str = "/proc/cpuinfo") -> dict[str, Any]:
    """Model, cores and the flags that matter, from /proc/cpuinfo (empty when unreadable)."""
    text = _read(cpuinfo_path)
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in text.splitlines()
            if line.startswith("model name")
        ),
        None,
    )
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    bf16 = [f for f in BF16_FLAGS if f in flags]
    return {
        "model": model,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "flags": {flag: flag in flags for flag in CPU_FLAGS_OF_INTEREST},
        "cpuinfo_readable": bool(text),
        "native_bf16": bool(bf16),
        "native_bf16_flags": bf16,
        "amx": "amx_tile" in flags,
    }


def memory_gib() -> float | None:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024**2, 1)
    return None


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


def nccl_facts() -> dict[str, Any]:
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


def tensorflow_facts() -> dict[str, Any]:
    import tensorflow as tf

    build = dict(tf.sysconfig.get_build_info())
    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        capability = details.get("compute_capability")
        gpus.append(
            {
                "name": device.name,
                "device_name": details.get("device_name"),
                "compute_capability": ".".join(map(str, capability)) if capability else None,
            }
        )
    return {
        "is_cuda_build": bool(build.get("is_cuda_build")),
        "cuda_version": build.get("cuda_version"),
        "cudnn_version": build.get("cudnn_version"),
        "cuda_compute_capabilities": list(build.get("cuda_compute_capabilities") or []),
        "gpus": gpus,
    }


def auto_choices(config: Any) -> dict[str, Any]:
    """What the training library resolves `precision` and `strategy` to here, and why."""
    from trainer_module.training import cluster_info, resolve_precision_policy

    policy, policy_reason = resolve_precision_policy(config.training)
    info = cluster_info()
    requested = config.training.strategy
    if requested in ("auto", "multi_worker") and info.num_workers > 1:
        strategy = "MultiWorkerMirroredStrategy"
        reason = (
            f"TF_CONFIG names {info.num_workers} workers (not built here: it would wait for them)"
        )
    else:
        from trainer_module.training import create_strategy
        from trainer_module.training.strategy import strategy_name

        built = create_strategy(config.training)
        strategy = strategy_name(built)
        replicas = built.num_replicas_in_sync
        if requested != "auto":
            reason = f"set in config (strategy={requested!r}), {replicas} replica(s)"
        elif replicas > 1:
            reason = f"{replicas} local devices"
        else:
            reason = (
                "one device: no TF_CONFIG cluster, fewer than 2 GPUs, num_logical_cpu_devices <= 1"
            )
    return {
        "precision": policy,
        "precision_reason": policy_reason,
        "strategy": strategy,
        "strategy_reason": reason,
    }


def _driver_too_old(driver: str, cuda_version: str | None) -> str | None:
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


def warnings_for(report: dict[str, Any]) -> list[str]:
    """Known pitfalls, each with what to do."""
    found = []
    tf_facts, smi, cpu = report["tensorflow"], report["nvidia_smi_gpus"], report["cpu"]
    if smi and not tf_facts["gpus"]:
        why = (
            "this TensorFlow is not a CUDA build"
            if not tf_facts["is_cuda_build"]
            else "the CUDA/cuDNN libraries it needs are probably missing (pip install 'tensorflow[and-cuda]')"
        )
        found.append(
            f"nvidia-smi sees {len(smi)} GPU(s) but TensorFlow sees none: {why}; training runs on the CPU"
        )
    for gpu in smi:
        need = _driver_too_old(gpu["driver"], tf_facts["cuda_version"])
        if need:
            found.append(
                f"GPU {gpu['index']} driver {gpu['driver']} is older than {need}, the minimum for CUDA "
                f"{tf_facts['cuda_version']} that TensorFlow was built with: update the NVIDIA driver"
            )
    if tf_facts["gpus"] and os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH", "").lower() == "false":
        found.append(
            "TF_FORCE_GPU_ALLOW_GROWTH=false: memory growth is off, so TensorFlow takes all GPU memory "
            "at start and a second process on the GPU fails; unset it (the trainer turns growth on)"
        )
    if len(tf_facts["gpus"]) > 1 and not report["nccl"]["available"]:
        found.append(
            "several GPUs but no loadable NCCL: multi-GPU all-reduce falls back to slower paths"
        )
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0":
        found.append(
            "TF_ENABLE_ONEDNN_OPTS=0 disables oneDNN: CPU training (and bf16 on CPU) is much slower"
        )
    auto = report["auto"]
    if auto["precision"] == "mixed_bfloat16" and not tf_facts["gpus"] and not cpu["native_bf16"]:
        found.append(
            "precision is mixed_bfloat16 but this CPU has no native bf16 (avx512_bf16/amx_bf16): it is "
            "emulated and slower than float32; use training.precision=auto or float32"
        )
    if not cpu["cpuinfo_readable"]:
        found.append(
            "/proc/cpuinfo is not readable: CPU features (and the bf16 choice) are unknown"
        )
    return found


def collect(config: Any) -> dict[str, Any]:
    cpu = cpu_facts()
    tf_facts = tensorflow_facts()
    smi = smi_gpus()
    report = {
        "versions": {
            "Python": platform.python_version(),
            **{label: _version(dist) for dist, label in PACKAGES},
        },
        "platform": platform.platform(),
        "cpu": cpu,
        "memory_gib": memory_gib(),
        "tensorflow": tf_facts,
        "nvidia_smi_gpus": smi,
        "interconnect": interconnect(max(len(smi), len(tf_facts["gpus"]))),
        "nccl": nccl_facts(),
        "memory_growth": {
            "TF_FORCE_GPU_ALLOW_GROWTH": os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"),
            "trainer_enables_growth": True,
        },
        "auto": auto_choices(config),
    }
    report["warnings"] = warnings_for(report)
    return report


# --- output ----------------------------------------------------------------------------------
def render(report: dict[str, Any]) -> str:
    cpu, tf_facts = report["cpu"], report["tensorflow"]
    yes = {True: "yes", False: "no"}
    lines = ["fullthrottle doctor", "", "Versions"]
    for name, version in report["versions"].items():
        lines.append(f"  {name:<14} {version or 'not installed'}")
    lines += ["", "CPU"]
    lines.append(f"  model          {cpu['model'] or 'unknown'}")
    lines.append(f"  cores          {cpu['usable_cores']} usable of {cpu['logical_cores']}")
    lines.append(f"  memory         {report['memory_gib']} GiB")
    present = [flag.upper() for flag, on in cpu["flags"].items() if on]
    absent = [flag.upper() for flag, on in cpu["flags"].items() if not on]
    lines.append(f"  features       {' '.join(present) or 'none of interest'}")
    lines.append(f"  missing        {' '.join(absent) or '-'}")
    bf16 = (
        f"yes ({', '.join(f.upper() for f in cpu['native_bf16_flags'])}): mixed_bfloat16 runs natively"
        if cpu["native_bf16"]
        else "no (no AVX512_BF16 or AMX_BF16): bf16 would be emulated, slower than float32"
    )
    lines.append(f"  native bf16    {bf16}")
    lines.append(f"  AMX            {yes[cpu['amx']]}")
    lines += ["", "GPUs"]
    if not tf_facts["gpus"] and not report["nvidia_smi_gpus"]:
        lines.append(
            "  none visible (no NVIDIA driver / nvidia-smi, or no GPU): training runs on the CPU"
        )
    for gpu in tf_facts["gpus"]:
        lines.append(
            f"  TensorFlow     {gpu['name']}: {gpu['device_name']}, compute capability {gpu['compute_capability']}"
        )
    for gpu in report["nvidia_smi_gpus"]:
        lines.append(
            f"  nvidia-smi     GPU {gpu['index']}: {gpu['name']}, {gpu['memory_mib']} MiB, "
            f"driver {gpu['driver']}, compute capability {gpu['compute_capability']}"
        )
    if report["interconnect"]:
        lines.append(
            f"  interconnect   {report['interconnect']['kind']} ({report['interconnect']['detail']})"
        )
    nccl = report["nccl"]
    lines.append(
        f"  NCCL           {nccl['version'] + ' (' + nccl['path'] + ')' if nccl['available'] else 'not found'}"
    )
    growth = report["memory_growth"]["TF_FORCE_GPU_ALLOW_GROWTH"]
    lines.append(
        "  memory growth  the trainer turns it on for every GPU"
        + (f"; TF_FORCE_GPU_ALLOW_GROWTH={growth}" if growth is not None else "")
    )
    lines += ["", "TensorFlow build"]
    if tf_facts["is_cuda_build"]:
        lines.append(
            f"  CUDA {tf_facts['cuda_version']}, cuDNN {tf_facts['cudnn_version']}, kernels for "
            f"{', '.join(tf_facts['cuda_compute_capabilities'])}"
        )
    else:
        lines.append("  CPU-only build (no CUDA)")
    auto = report["auto"]
    lines += [
        "",
        "What `auto` picks here",
        f"  precision      {auto['precision']}: {auto['precision_reason']}",
        f"  strategy       {auto['strategy']}: {auto['strategy_reason']}",
        "",
    ]
    if report["warnings"]:
        lines.append("Warnings")
        lines += [f"  ! {warning}" for warning in report["warnings"]]
    else:
        lines.append("No known pitfalls found.")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    report = collect(config)
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(render(report))
    return 0
