"""`fullthrottle doctor`: is this machine set up to train fast, and what would `auto` pick here?

Owns: collecting facts (versions, CPU features, memory, GPUs, NCCL, CUDA/cuDNN of the TF build,
GPU interconnect), asking the training library what `precision: auto` and `strategy: auto`
resolve to for the given config, and turning known pitfalls into warnings. Refuses nothing: a
fact that cannot be read is reported as unknown, never raised; only a bad `--config`/`--set` is
an error. It never builds a multi-worker strategy (that would wait for the other workers).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import sys
from typing import Any

from fullthrottle.commands.options import add_config_arguments, config_from_args
from trainer_module.training import hardware

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


def cpu_facts(cpuinfo_path: str = hardware.CPUINFO) -> dict[str, Any]:
    """Model, cores and the flags that matter (empty when /proc/cpuinfo is unreadable)."""
    cpu = hardware.cpu_info(cpuinfo_path)
    return {
        "model": cpu.model,
        "logical_cores": cpu.logical_cores,
        "usable_cores": cpu.usable_cores,
        "flags": {flag: flag in cpu.flags for flag in hardware.CPU_FLAGS_OF_INTEREST},
        "cpuinfo_readable": cpu.readable,
        "native_bf16": cpu.native_bf16,
        "native_bf16_flags": list(cpu.native_bf16_flags),
        "amx": cpu.amx,
    }


def memory_gib() -> float | None:
    memory = hardware.physical_memory_bytes()
    return round(memory / 1024**3, 1) if memory else None


def tensorflow_facts() -> dict[str, Any]:
    gpus = [
        {
            "name": gpu.name,
            "device_name": gpu.device_name,
            "compute_capability": ".".join(map(str, gpu.compute_capability))
            if gpu.compute_capability
            else None,
        }
        for gpu in hardware.tensorflow_gpus()
    ]
    return {**hardware.tensorflow_build(), "gpus": gpus}


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


def warnings_for(report: dict[str, Any]) -> list[str]:
    """Known pitfalls, each with what to do."""
    found = []
    tf_facts, driver, cpu = report["tensorflow"], report["driver"], report["cpu"]
    smi = driver["gpus"]
    if smi and not tf_facts["gpus"]:
        why = (
            "this TensorFlow is not a CUDA build"
            if not tf_facts["is_cuda_build"]
            else "the CUDA/cuDNN libraries it needs are probably missing (pip install 'tensorflow[and-cuda]')"
        )
        found.append(
            f"the driver sees {len(smi)} GPU(s) but TensorFlow sees none: {why}; training runs on the CPU"
        )
    need = hardware.driver_too_old(driver["driver_version"] or "", tf_facts["cuda_version"])
    if need:
        found.append(
            f"driver {driver['driver_version']} is older than {need}, the minimum for CUDA "
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
    nvml = hardware.nvml_facts()
    report = {
        "versions": {
            "Python": platform.python_version(),
            **{label: _version(dist) for dist, label in PACKAGES},
        },
        "platform": platform.platform(),
        "cpu": cpu,
        "memory_gib": memory_gib(),
        "tensorflow": tf_facts,
        "driver": dataclasses.asdict(nvml),
        "interconnect": hardware.interconnect_summary(hardware.gpu_links(nvml)),
        "nccl": hardware.nccl(),
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
    driver = report["driver"]
    if not tf_facts["gpus"] and not driver["gpus"]:
        lines.append(
            "  none visible (no NVIDIA driver / nvidia-smi, or no GPU): training runs on the CPU"
        )
    for gpu in tf_facts["gpus"]:
        lines.append(
            f"  TensorFlow     {gpu['name']}: {gpu['device_name']}, compute capability {gpu['compute_capability']}"
        )
    for gpu in driver["gpus"]:
        lines.append(
            f"  NVML           GPU {gpu['index']}: {gpu['name']}, {gpu['memory_mib']} MiB, "
            f"driver {driver['driver_version']}, compute capability {gpu['compute_capability']}"
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
