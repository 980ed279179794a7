"""Runs the pipeline on this machine: `LocalDagRunner`, Beam's DirectRunner, an MLMD SQLite store.

This module chooses paths and Beam options, calls `create_pipeline`, and reads the outcome back
from ML Metadata. It contains no training or data logic.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tfx import v1 as tfx

from fullthrottle.config import BeamConfig, Config
from pipelines.pipeline import create_pipeline


def beam_pipeline_args(beam: BeamConfig) -> list[str]:
    """DirectRunner options from the config; `extra_args` come last so they can override."""
    args = [f"--direct_running_mode={beam.direct_running_mode}"]
    if beam.direct_running_mode != "in_memory":
        workers = beam.direct_num_workers or (os.cpu_count() or 1)
        args.append(f"--direct_num_workers={workers}")
    args.extend(beam.extra_args)
    return args


def build_local_pipeline(
    config: Config, *, input_base: str, extra_beam_args: Sequence[str] = ()
) -> tfx.dsl.Pipeline:
    config.mlmd_path.parent.mkdir(parents=True, exist_ok=True)
    config.serving_dir.mkdir(parents=True, exist_ok=True)
    return create_pipeline(
        config,
        input_base=input_base,
        pipeline_root=str(config.pipeline_root),
        serving_dir=str(config.serving_dir),
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            str(config.mlmd_path)
        ),
        beam_pipeline_args=[*beam_pipeline_args(config.beam), *extra_beam_args],
    )


def run_local(config: Config, *, input_base: str) -> None:
    """Runs the whole pipeline; component errors propagate unchanged."""
    pipeline = build_local_pipeline(config, input_base=input_base)
    tfx.orchestration.LocalDagRunner().run(pipeline)


def mlmd_path_exists(config: Config) -> bool:
    return Path(config.mlmd_path).exists()
