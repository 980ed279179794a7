"""`fullthrottle run` with MirroredStrategy over several devices, in a fresh process as a user
runs it: the data components use TensorFlow in the same process before the Trainer, so the
devices must be set up before they run (pipelines.local_runner.configure_devices).

A fresh process matters: this test process configured two logical CPUs at start (conftest), so
an in-process run would pass whether or not `fullthrottle run` sets its devices up itself.
On a machine with GPUs the same commands train over all of them instead.

The run is the bundled text data's (configs/text_topics.yaml): the Transformer path end to end,
its held-out accuracy and its answers to raw strings, English and Chinese, are checked on the
same run (one whole pipeline run for both).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import (
    REPO,
    assert_all_components_completed,
    eval_split_examples,
    label_of,
    last_run,
    leftovers,
    run_cli,
    strip_label,
)

GPUS = len(tf.config.list_physical_devices("GPU"))


@pytest.mark.slow
def test_multi_gpu_run_trains_over_every_device_and_pushes(tmp_path):
    """One fresh-process run covers two option paths: the `multi_gpu` preset (MirroredStrategy,
    XLA) over two logical CPUs, and the Transformer on text. (The data steps on DirectRunner's
    multi_processing mode, with TFX's packages left nowhere: the Beam benchmark's test.)"""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    result = run_cli(
        "run",
        "--config",
        str(REPO / "configs" / "text_topics.yaml"),
        "--output-dir",
        str(tmp_path / "out"),
        "--preset",
        "multi_gpu",
        "--set",
        "training.num_logical_cpu_devices=2",
        env={"TMPDIR": str(tmpdir)},
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-5000:]}"
    summary = last_run(tmp_path / "out")
    assert summary["status"] == "succeeded" and summary["blessed"]
    assert summary["config"]["training"]["jit_compile"] is True
    assert_all_components_completed(summary)
    # The run's scratch temp folder goes, with what TensorFlow, Beam and TFX left in it.
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
    _assert_the_text_model_answers(summary)


def _assert_the_text_model_answers(last: dict) -> None:
    """The Transformer trained on the bundled text data answers held-out rows and raw strings."""
    assert last["training"]["model_kind"] == "transformer"
    assert last["blessed"] and last["pushed_model_dir"]
    model = tf.saved_model.load(last["pushed_model_dir"])

    # Held-out rows through serving_default (serialized tf.Example with the raw text inside).
    records = eval_split_examples(last)
    labels = [label_of(r, "topic") for r in records]
    outputs = model.signatures["serving_default"](
        examples=tf.constant([strip_label(r, "topic") for r in records])
    )
    np.testing.assert_allclose(outputs["probabilities"].numpy().sum(axis=1), 1.0, atol=1e-5)
    accuracy = np.mean(
        [c.decode() == y for c, y in zip(outputs["classes"].numpy(), labels, strict=True)]
    )
    assert accuracy > 0.7, accuracy

    # Raw strings (English and Chinese) through the raw-feature signature.
    raw = model.signatures["predict_raw"]
    specs = raw.structured_input_signature[1]
    assert specs["length_hint"].dtype == tf.float32
    messages = [
        "the team won the match with a late goal",
        "今天的面条非常好吃",
        "my laptop battery update",
    ]
    inputs = {
        "message": tf.constant(messages),
        "language": tf.constant(["en", "zh", "en"]),
        # A numeric column is a number (float32) although the CSV holds whole numbers only.
        "length_hint": tf.constant([float(len(m)) for m in messages]),
    }
    answer = raw(**inputs)
    probabilities = answer["probabilities"].numpy()
    assert probabilities.shape == (3, 4)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert set(c.decode() for c in answer["classes"].numpy()) <= {
        "sports",
        "tech",
        "food",
        "travel",
    }
