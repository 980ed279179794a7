"""`fullthrottle doctor`: is this machine set up to train fast, and what would `auto` pick here?

Owns: collecting facts (versions, CPU features, memory; TensorFlow's CUDA/cuDNN build and
whether its CUDA libraries load; the NVIDIA driver as this environment sees it and as NVML
describes it: version, CUDA level, each GPU's name, memory, compute capability and NVLink/PCIe
links; NCCL), asking the training library what `precision: auto` and `strategy: auto` resolve
to for the given config, and turning mismatches into warnings that say what to do
(`warnings_for`, a pure function of the report) and facts worth knowing into notes
(`notes_for`). Every probe is in `trainer_module.training.hardware`. Refuses nothing: a fact
that cannot be read is reported as unknown, never raised; only a bad `--config`/`--set` is an
error. It never builds a multi-worker strategy (that would wait for the other workers).

Exit status: 0 when nothing needs fixing (a machine without a GPU, which trains on the CPU,
included), 1 when there is at least one warning, 2 for a bad `--config`/`--set`.
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
from fullthrottle.core import exit_status
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
            "Reports the versions of the stack, the CPU's features (AVX-512, BF16, AMX), the "
            "CUDA/cuDNN versions TensorFlow was built with and whether its CUDA libraries load, "
            "the NVIDIA driver and the CUDA level it supports, each GPU's name, memory, compute "
            "capability and interconnect (NVLink or PCIe), NCCL, the precision policy and "
            "distribution strategy `auto` would pick for your config and why, and a warning "
            "with what to do for each mismatch (no driver in the environment, a driver too old "
            "for the CUDA build, missing CUDA libraries, GPUs TensorFlow does not see)."
        ),
        epilog=(
            "Exit status: 0 nothing to fix (no GPU is not a problem: training runs on the "
            "CPU), 1 at least one warning, 2 a bad --config or --set.\n\n"
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


def _capability(value: tuple[int, int] | None) -> str | None:
    return ".".join(map(str, value)) if value else None


def _capability_tuple(value: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (int(part) for part in (value or "").split("."))
    except ValueError:
        return None
    return major, minor


def gpu_facts() -> dict[str, Any]:
    """TensorFlow's build, GPUs and CUDA libraries; the driver as the environment shows it and
    as NVML describes it; the links between GPUs. JSON-safe."""
    build = hardware.tensorflow_build()
    libraries = hardware.cuda_libraries(build)
    environment = hardware.gpu_environment(libraries=libraries)
    nvml = hardware.nvml_facts()
    tf_gpus = [
        {
            "name": gpu.name,
            "device_name": gpu.device_name,
            "compute_capability": _capability(gpu.compute_capability),
        }
        for gpu in hardware.tensorflow_gpus()
    ]
    driver = dataclasses.asdict(nvml)
    driver["gpus"] = [
        {**dataclasses.asdict(gpu), "compute_capability": _capability(gpu.compute_capability)}
        for gpu in nvml.gpus
    ]
    return {
        "tensorflow": {
            **build,
            "gpus": tf_gpus,
            "library_dirs": hardware.tensorflow_library_dirs(),
        },
        "cuda_libraries": [dataclasses.asdict(library) for library in libraries],
        "gpu_environment": dataclasses.asdict(environment),
        "driver": driver,
        "interconnect": hardware.interconnect_summary(hardware.gpu_links(nvml)),
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


def warnings_for(report: dict[str, Any]) -> list[str]:
    """Mismatches and pitfalls in ``report`` (as `collect` makes it), each with what to do.
    Pure: the tests give it composed reports."""
    found: list[str] = []
    tf_facts, driver, cpu = report["tensorflow"], report["driver"], report["cpu"]
    environment = hardware.GpuEnvironment(**report["gpu_environment"])
    tf_gpus, nvml_gpus = tf_facts["gpus"], driver["gpus"]
    build_caps = tf_facts["cuda_compute_capabilities"]

    def add(message: str) -> None:
        if not any(message in earlier for earlier in found):
            found.append(message)

    if not tf_gpus and (environment.driver_present or nvml_gpus):
        add(
            "TensorFlow sees no GPU, so training runs on the CPU: "
            + hardware.no_gpu_reason(environment)
        )
    missing = [lib["soname"] for lib in report["cuda_libraries"] if lib["error"]]
    if tf_facts["is_cuda_build"] and missing:
        add(hardware.missing_libraries_advice(missing))
    driver_version = driver["driver_version"] or environment.kernel_driver
    need = hardware.driver_too_old(driver_version or "", tf_facts["cuda_version"])
    if need:
        add(
            f"the NVIDIA driver {driver_version} is older than {need}, the minimum for the "
            f"CUDA {tf_facts['cuda_version']} this TensorFlow was built with: update the driver"
        )
    ignored = 0
    for gpu in nvml_gpus:
        capability = _capability_tuple(gpu["compute_capability"])
        if capability is None or not tf_facts["is_cuda_build"]:
            continue
        support = hardware.kernel_support(capability, build_caps)
        label = (
            f"GPU {gpu['index']} ({gpu['name']}, compute capability {gpu['compute_capability']})"
        )
        if support == "none":
            ignored += 1
            lowest = hardware.lowest_capability(build_caps)
            add(
                f"{label} is older than every GPU this TensorFlow has kernels for "
                f"({', '.join(build_caps)}): TensorFlow ignores it; train on a GPU of compute "
                f"capability {_capability(lowest)} or newer"
            )
        elif support == "ptx" and hardware.cuda_level_below(
            driver["cuda_level"], tf_facts["cuda_version"]
        ):
            add(
                f"{label} runs TensorFlow's kernels from PTX of CUDA {tf_facts['cuda_version']}, "
                f"which this driver (CUDA {driver['cuda_level']}) cannot compile: update the "
                f"driver to one for CUDA {'.'.join(tf_facts['cuda_version'].split('.')[:2])} "
                "or newer"
            )
    hidden = environment.cuda_visible_devices
    if tf_gpus and len(nvml_gpus) - ignored > len(tf_gpus) and hidden is None:
        add(
            f"the driver sees {len(nvml_gpus)} GPUs but TensorFlow only {len(tf_gpus)}: run "
            "with --verbose to see TensorFlow's reason in its log"
        )
    if tf_gpus and driver["error"]:
        add(
            f"TensorFlow sees {len(tf_gpus)} GPU(s) but NVML does not start ({driver['error']}): "
            "the driver's libnvidia-ml.so.1 is not in this environment, so the driver, memory "
            "and links are unknown here and MLflow logs no GPU metrics; bin/envrun hands it "
            "over with libcuda.so.1 (a container needs NVIDIA_DRIVER_CAPABILITIES to include "
            "`utility`)"
        )
    growth = report["memory_growth"]["TF_FORCE_GPU_ALLOW_GROWTH"] or ""
    if tf_gpus and growth.lower() == "false":
        add(
            "TF_FORCE_GPU_ALLOW_GROWTH=false: memory growth is off, so TensorFlow takes all GPU memory "
            "at start and a second process on the GPU fails; unset it (the trainer turns growth on)"
        )
    if len(tf_gpus) > 1 and not report["nccl"]["available"]:
        add("several GPUs but no loadable NCCL: multi-GPU all-reduce falls back to slower paths")
    if report["onednn"]["TF_ENABLE_ONEDNN_OPTS"] == "0":
        add(
            "TF_ENABLE_ONEDNN_OPTS=0 disables oneDNN: CPU training (and bf16 on CPU) is much slower"
        )
    auto = report["auto"]
    if auto["precision"] == "mixed_bfloat16" and not tf_gpus and not cpu["native_bf16"]:
        add(
            "precision is mixed_bfloat16 but this CPU has no native bf16 (avx512_bf16/amx_bf16): it is "
            "emulated and slower than float32; use training.precision=auto or float32"
        )
    if not cpu["cpuinfo_readable"]:
        add("/proc/cpuinfo is not readable: CPU features (and the bf16 choice) are unknown")
    return found


def notes_for(report: dict[str, Any]) -> list[str]:
    """Facts worth knowing that need no fixing. Pure, like `warnings_for`."""
    notes = []
    tf_facts, driver = report["tensorflow"], report["driver"]
    hidden = report["gpu_environment"]["cuda_visible_devices"]
    if hidden and hidden.strip() not in ("-1",) and driver["gpus"]:
        notes.append(
            f"CUDA_VISIBLE_DEVICES={hidden!r}: TensorFlow uses {len(tf_facts['gpus'])} of the "
            f"{len(driver['gpus'])} GPUs the driver sees"
        )
    for gpu in driver["gpus"]:
        capability = _capability_tuple(gpu["compute_capability"])
        if (
            capability
            and tf_facts["is_cuda_build"]
            and hardware.kernel_support(capability, tf_facts["cuda_compute_capabilities"]) == "ptx"
        ):
            notes.append(
                f"GPU {gpu['index']} ({gpu['name']}, compute capability "
                f"{gpu['compute_capability']}): this TensorFlow has no machine code for it, so "
                "the driver compiles its kernels from PTX at the first start (it can take many "
                "minutes; the driver's compute cache keeps them)"
            )
    if hardware.cuda_level_below(driver["cuda_level"], tf_facts["cuda_version"]):
        notes.append(
            f"the driver supports CUDA {driver['cuda_level']}, older than the CUDA "
            f"{tf_facts['cuda_version']} TensorFlow was built with: it runs by CUDA's "
            "minor-version compatibility, but PTX from the newer CUDA cannot be compiled by it"
        )
    link = report["interconnect"]
    if link and link["kind"] != "NVLink":
        notes.append(
            "some or all GPUs talk over PCIe, without NVLink: MirroredStrategy's gradient "
            "all-reduce crosses it every step; a larger training.per_replica_batch_size or "
            "training.gradient_accumulation_steps makes it a smaller share of the step"
        )
    return notes


def collect(config: Any) -> dict[str, Any]:
    report = {
        "versions": {
            "Python": platform.python_version(),
            **{label: _version(dist) for dist, label in PACKAGES},
        },
        "platform": platform.platform(),
        "cpu": cpu_facts(),
        "memory_gib": memory_gib(),
        **gpu_facts(),
        "nccl": hardware.nccl(),
        "memory_growth": {
            "TF_FORCE_GPU_ALLOW_GROWTH": os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"),
            "trainer_enables_growth": True,
        },
        "onednn": {"TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS")},
        # Last: building a strategy starts TensorFlow's runtime on every GPU.
        "auto": auto_choices(config),
    }
    report["warnings"] = warnings_for(report)
    report["notes"] = notes_for(report)
    return report


# --- output ----------------------------------------------------------------------------------
def _mib(value: int | None) -> str:
    return f"{value / 1024:.0f} GiB" if value and value >= 1024 else f"{value} MiB"


def render(report: dict[str, Any]) -> str:
    cpu, tf_facts = report["cpu"], report["tensorflow"]
    driver, environment = report["driver"], report["gpu_environment"]
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

    lines += ["", "TensorFlow build"]
    if tf_facts["is_cuda_build"]:
        lines.append(
            f"  CUDA {tf_facts['cuda_version']}, cuDNN {tf_facts['cudnn_version']}, kernels for "
            f"{', '.join(tf_facts['cuda_compute_capabilities'])}"
        )
        libraries = report["cuda_libraries"]
        loaded = [lib for lib in libraries if not lib["error"]]
        versions = ", ".join(
            f"{lib['soname'].split('.so')[0].removeprefix('lib')} {lib['version']}"
            for lib in loaded
            if lib["version"]
        )
        folders = sorted({os.path.dirname(lib["path"]) for lib in loaded if os.sep in lib["path"]})
        where = os.path.commonpath(folders) if folders else "the loader's default paths"
        lines.append(
            f"  CUDA libraries {len(loaded)} of {len(libraries)} load"
            + (f" ({versions})" if versions else "")
            + (f", from {where}" if loaded else "")
        )
        for lib in libraries:
            if lib["error"]:
                lines.append(f"  not loaded     {lib['soname']}: {lib['error']}")
    else:
        lines.append("  CPU-only build (no CUDA)")

    lines += ["", "NVIDIA driver and GPUs"]
    if driver["error"] is None:
        level = f", supports CUDA {driver['cuda_level']}" if driver["cuda_level"] else ""
        lines.append(f"  driver         {driver['driver_version']}{level} (NVML)")
    else:
        none = "" if hardware.GpuEnvironment(**environment).driver_present else "none found: "
        lines.append(f"  driver         {none}NVML does not start ({driver['error']})")
        lines.append(
            f"  kernel module  {environment['kernel_driver'] or 'not loaded'} "
            f"({hardware.PROC_DRIVER_VERSION})"
        )
    lines.append(
        f"  device nodes   {' '.join(environment['device_nodes']) or 'none (/dev/nvidia*)'}"
    )
    lines.append(
        f"  {hardware.LIBCUDA:<14} "
        + ("loads" if environment["libcuda_error"] is None else "does not load")
    )
    for gpu in driver["gpus"]:
        lines.append(
            f"  GPU {gpu['index']:<10} {gpu['name']}, {_mib(gpu['memory_mib'])}, compute "
            f"capability {gpu['compute_capability']}, PCI {gpu['pci_bus_id']}"
        )
    if report["interconnect"]:
        link = report["interconnect"]
        lines.append(f"  interconnect   {link['kind']}: {link['detail']}")
    if tf_facts["gpus"]:
        for gpu in tf_facts["gpus"]:
            lines.append(
                f"  TensorFlow     {gpu['name']}: {gpu['device_name']}, compute capability "
                f"{gpu['compute_capability']}"
            )
    else:
        lines.append(
            "  TensorFlow     sees no GPU, training runs on the CPU: "
            + hardware.no_gpu_reason(hardware.GpuEnvironment(**environment))
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

    auto = report["auto"]
    lines += [
        "",
        "What `auto` picks here",
        f"  precision      {auto['precision']}: {auto['precision_reason']}",
        f"  strategy       {auto['strategy']}: {auto['strategy_reason']}",
        "",
    ]
    if report["notes"]:
        lines.append("Notes")
        lines += [f"  - {note}" for note in report["notes"]]
        lines.append("")
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
    return exit_status.FINDINGS if report["warnings"] else exit_status.SUCCESS
