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

from tests.helpers import assert_all_components_completed, last_run, leftovers, run_cli

GPUS = len(tf.config.list_physical_devices("GPU"))


@pytest.mark.slow
def test_multi_gpu_run_trains_over_every_device_with_beam_workers_and_pushes(tmp_path):
    """One fresh-process run covers three option paths: the `multi_gpu` preset (MirroredStrategy,
    XLA) over two logical CPUs, and the data steps on DirectRunner's multi_processing mode with
    2 workers (the option path a distributed runner uses)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    result = run_cli(
        "run",
        "--output-dir",
        str(tmp_path / "out"),
        "--preset",
        "multi_gpu",
        "--set",
        "training.num_logical_cpu_devices=2",
        "--set",
        "training.train_steps=100",
        "--set",
        "beam.direct_running_mode=multi_processing",
        "--set",
        "beam.direct_num_workers=2",
        env={"TMPDIR": str(tmpdir)},
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-5000:]}"
    summary = last_run(tmp_path / "out")
    assert summary["status"] == "succeeded" and summary["blessed"]
    assert summary["config"]["beam"]["direct_running_mode"] == "multi_processing"
    assert summary["config"]["training"]["jit_compile"] is True
    assert_all_components_completed(summary)
    # With Beam arguments TFX packages itself for every Beam component; the run's scratch temp
    # folder takes those packages away with it (and its own folder goes too).
    assert leftovers(tmpdir) == []
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
