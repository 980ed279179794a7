"""Runs the pipeline on this machine: `LocalDagRunner`, Beam's DirectRunner, an MLMD SQLite store.

This module chooses paths and Beam options, calls `create_pipeline`, and reads the outcome back
from ML Metadata. It contains no training or data logic.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tfx.orchestration.local.local_dag_runner import LocalDagRunner
from tfx.orchestration.metadata import sqlite_metadata_connection_config
from tfx.orchestration.pipeline import Pipeline

from fullthrottle.core.config import BeamConfig, Config
from fullthrottle.core.scratch import scratch_tempdir
from pipelines.pipeline import create_pipeline
from trainer_module.training import TrainingConfig
from trainer_module.training.hardware import TensorFlowGpu, device_summary, tensorflow_gpus


def beam_pipeline_args(beam: BeamConfig) -> list[str]:
    """DirectRunner options from the config; `extra_args` come last so they can override.

    `in_memory` is DirectRunner's default and gets no flag: with any Beam argument at all, each
    TFX Beam executor packages TFX itself into an sdist for remote workers (`dependency_utils.
    make_beam_dependency_flags`: a ~50 MB copy plus `setup.py sdist`, 2.2 s measured, in a new
    temp folder it never deletes), which local workers do not need. See `run_pipeline`.
    """
    args: list[str] = []
    if beam.direct_running_mode != "in_memory":
        workers = beam.direct_num_workers or (os.cpu_count() or 1)
        args += [
            f"--direct_running_mode={beam.direct_running_mode}",
            f"--direct_num_workers={workers}",
        ]
    args.extend(beam.extra_args)
    return args


def run_pipeline(pipeline: Pipeline) -> None:
    """`LocalDagRunner().run(pipeline)` with Python's temp folder pointed at a scratch folder
    that is removed after the run. What TFX and Beam make in temp folders and do not delete
    stays there: Beam's job-server and pipeline folders, TFX executors' temp folders (13 empty
    folders per default run, measured), and with Beam arguments (a mode other than `in_memory`,
    or `beam.extra_args`) the throw-away sdist TFX builds of itself for every Beam component
    (see `beam_pipeline_args`; ~50 MB each: 3,900 of them, 67 GB, had filled this machine's
    disk)."""
    with scratch_tempdir(prefix="fullthrottle-run-"):
        LocalDagRunner().run(pipeline)


def build_local_pipeline(
    config: Config,
    *,
    input_base: str,
    extra_beam_args: Sequence[str] = (),
    trainer_tracking: Mapping[str, Any] | None = None,
) -> Pipeline:
    config.mlmd_path.parent.mkdir(parents=True, exist_ok=True)
    config.serving_dir.mkdir(parents=True, exist_ok=True)
    return create_pipeline(
        config,
        input_base=input_base,
        pipeline_root=str(config.pipeline_root),
        serving_dir=str(config.serving_dir),
        metadata_connection_config=sqlite_metadata_connection_config(str(config.mlmd_path)),
        beam_pipeline_args=[*beam_pipeline_args(config.beam), *extra_beam_args],
        trainer_tracking=trainer_tracking,
    )


def configure_devices(training: TrainingConfig) -> list[TensorFlowGpu]:
    """Sets this process's TensorFlow devices up for the Trainer, before any component runs.

    TensorFlow fixes its devices the first time it uses one, and LocalDagRunner runs every
    component in this process: StatisticsGen and Transform use TensorFlow long before the
    Trainer does. So what the Trainer needs from the device list is set here, first: GPU memory
    growth (the data components and the Trainer share the GPUs instead of the first one taking
    all their memory) and, for MirroredStrategy without GPUs, `num_logical_cpu_devices` logical
    CPU devices. Returns the GPUs TensorFlow sees. A process whose TensorFlow is already
    initialised keeps its devices; the Trainer then refuses a logical-device count it cannot have.
    """
    from trainer_module.training.strategy import (
        cluster_info,
        enable_gpu_memory_growth,
        logical_cpu_devices,
    )

    gpus = tensorflow_gpus()
    enable_gpu_memory_growth()
    # Multi-worker collectives must be configured before the runtime starts, by the strategy
    # itself: creating logical devices here would start it.
    if (
        training.num_logical_cpu_devices > 1
        and training.strategy in ("auto", "mirrored")
        and cluster_info().num_workers == 1
    ):
        logical_cpu_devices(training.num_logical_cpu_devices)
    return gpus


def run_local(
    config: Config, *, input_base: str, trainer_tracking: Mapping[str, Any] | None = None
) -> None:
    """Runs the whole pipeline; component errors propagate unchanged. `trainer_tracking`: the
    Trainer's MLflow link (see `create_pipeline`)."""
    gpus = configure_devices(config.training)
    print(
        "fullthrottle: "
        + device_summary(gpus, logical_cpus=config.training.num_logical_cpu_devices),
        file=sys.stderr,
    )
    run_pipeline(
        build_local_pipeline(config, input_base=input_base, trainer_tracking=trainer_tracking)
    )
