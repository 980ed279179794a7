"""`fullthrottle run` with MirroredStrategy over several devices, in a fresh process as a user
runs it: the data components use TensorFlow in the same process before the Trainer, so the
devices must be set up before they run (pipelines.local_runner.configure_devices).

A fresh process matters: this test process configured two logical CPUs at start (conftest), so
an in-process run would pass whether or not `fullthrottle run` sets its devices up itself.
On a machine with GPUs the same commands train over all of them instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf

from tests.helpers import last_run, run_cli

GPUS = len(tf.config.list_physical_devices("GPU"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "arguments",
    [
        ("--set", "training.strategy=mirrored", "--set", "training.num_logical_cpu_devices=2"),
        ("--preset", "multi_gpu", "--set", "training.num_logical_cpu_devices=2"),
    ],
    ids=["mirrored", "multi_gpu_preset"],
)
def test_mirrored_run_trains_over_every_device_and_pushes(arguments, tmp_path):
    result = run_cli(
        "run", "--output-dir", str(tmp_path), "--set", "training.train_steps=100", *arguments
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-5000:]}"
    summary = last_run(tmp_path)
    assert summary["status"] == "succeeded" and summary["blessed"]
    assert (Path(summary["pushed_model_dir"]) / "saved_model.pb").is_file()
    training = summary["training"]
    assert training["strategy_name"] == "MirroredStrategy"
    assert training["num_replicas"] == (GPUS or 2)
    assert training["global_batch_size"] == training["per_replica_batch_size"] * (GPUS or 2)
    if not GPUS:
        # Said once, before the pipeline runs, in words.
        assert (
            "fullthrottle: training on the CPU (2 logical devices): TensorFlow sees no GPU, "
            in result.stderr
        )
