"""The training loop on small synthetic TFRecords (real TensorFlow, nothing mocked).

Covers: both models learn (loss falls) in eager / tf.function / XLA modes; every precision
policy learns and float16 reports its loss scale (and skips overflowing steps); a NaN-producing
learning rate stops with TrainingDivergedError naming the step and exports nothing; hooks,
TensorBoard scalars and the profiler window; the float32 serving twin; the input-wait meter.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.training_data import feature_spec, tabular_inputs, text_inputs, write_records
from trainer_module.training import (
    InputDataError,
    TrainingConfig,
    TrainingDivergedError,
    TrainingError,
    TrainingHook,
    train,
)
from trainer_module.training.config import BatchSizes
from trainer_module.training.loop import TrainLoop
from trainer_module.training.models import build_model
from trainer_module.training.optimization import create_optimizer


@pytest.fixture(scope="module")
def tabular(tmp_path_factory):
    d = tmp_path_factory.mktemp("tabular")
    inputs = tabular_inputs()
    train_files = write_records(d / "train", inputs, files=2, per_file=256)
    eval_files = write_records(d / "eval", inputs, files=1, per_file=128, seed=1)
    return inputs, train_files, eval_files


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    inputs = text_inputs()
    train_files = write_records(d / "train", inputs, files=2, per_file=256)
    eval_files = write_records(d / "eval", inputs, files=1, per_file=128, seed=1)
    return inputs, train_files, eval_files


def _run(dataset, work_dir, hooks=(), **overrides):
    inputs, train_files, eval_files = dataset
    base = dict(
        per_replica_batch_size=32,
        train_steps=40,
        steps_per_loop=10,
        checkpoint_every_steps=20,
        learning_rate=5e-3,
        models={"tabular": {"hidden_units": (32,)}},
        precision="float32",
    )
    base.update(overrides)
    return train(
        config=TrainingConfig(**base),
        model_inputs=inputs,
        feature_spec=feature_spec(inputs),
        train_files=train_files,
        eval_files=eval_files,
        work_dir=str(work_dir),
        hooks=hooks,
    )


def _loss_fell(result, factor=0.9):
    losses = [r["loss"] for r in result.history]
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < factor * losses[0], losses


@pytest.mark.parametrize(
    "mode",
    [{"run_eagerly": True}, {}, {"jit_compile": True}],
    ids=["eager", "tf.function", "tf.function+xla"],
)
def test_tabular_model_learns(tabular, tmp_path, mode):
    result = _run(tabular, tmp_path, **mode)
    assert result.facts.model_kind == "tabular"
    assert result.steps_completed == 40
    _loss_fell(result)
    assert result.eval_metrics["examples"] == 128
    assert result.eval_metrics["accuracy"] > 0.5  # 3 classes: chance is ~1/3
    assert 0.0 <= result.input_wait_fraction <= 1.0
    assert result.examples_per_second > 0


def test_transformer_model_learns(text, tmp_path):
    result = _run(
        text,
        tmp_path,
        learning_rate=3e-3,
        models={"transformer": {"layers": 1, "d_model": 32, "heads": 2, "ffn_dim": 64}},
        dropout_rate=0.0,
    )
    assert result.facts.model_kind == "transformer"
    _loss_fell(result, factor=0.8)
    assert result.eval_metrics["accuracy"] > 0.6
    # The serving twin answers the raw transformed features with float32 probabilities.
    inputs = text_inputs()
    batch = {
        "x0": np.zeros(2, np.float32),
        "tokens": np.array([[1, 2, 3, 0, 0, 0, 0, 0], [21, 22, 23, 24, 0, 0, 0, 0]], np.int64),
    }
    probs = result.serving_model(batch)
    assert probs.dtype == tf.float32 and tuple(probs.shape) == (2, inputs.num_classes)
    np.testing.assert_allclose(np.sum(probs, axis=-1), 1.0, rtol=1e-5)
    assert list(np.argmax(probs, axis=-1)) == [0, 2]


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_each_precision_policy_learns(tabular, tmp_path, precision):
    result = _run(tabular, tmp_path, precision=precision)
    assert result.facts.precision_policy == precision
    _loss_fell(result)
    scales = [r["loss_scale"] for r in result.history]
    if precision == "mixed_float16":
        assert all(s is not None and s >= 1 for s in scales), scales
    else:
        assert scales == [None] * len(scales)
        assert result.loss_scale_skipped_steps == 0
    # The serving model is float32 whatever the training policy, and carries the weights.
    serving = result.serving_model
    assert all(layer.dtype_policy.name == "float32" for layer in serving.layers)
    assert all(w.dtype == "float32" for w in serving.weights)
    for a, b in zip(serving.get_weights(), result.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_float16_loss_scale_skips_overflowing_steps(tabular, tmp_path):
    # A loss scale of 2^28 overflows float16 gradients (max 65504): the scaler must skip those
    # updates, halve the scale until the gradients fit, count the skips, and still learn.
    result = _run(
        tabular, tmp_path, precision="mixed_float16", loss_scale_initial=2.0**28, steps_per_loop=5
    )
    scales = [r["loss_scale"] for r in result.history]
    assert result.loss_scale_skipped_steps > 0
    assert scales[-1] < 2.0**28
    assert result.steps_completed == 40
    _loss_fell(result)


def test_nan_learning_rate_raises_diverged_naming_step_and_exports_nothing(tabular, tmp_path):
    class Recorder(TrainingHook):
        ended = False

        def on_train_end(self, result):
            Recorder.ended = True

    with pytest.raises(TrainingDivergedError) as info:
        _run(tabular, tmp_path, learning_rate=1e30, checkpoint_every_steps=0, hooks=[Recorder()])
    err = info.value
    assert isinstance(err, TrainingError) and 1 <= err.step <= 10
    assert f"step {err.step}" in str(err) and "learning_rate" in str(err)
    assert not np.isfinite(err.loss)
    assert not Recorder.ended
    assert not os.path.exists(tmp_path / "checkpoints") or not os.listdir(tmp_path / "checkpoints")


def test_hooks_summaries_profile_and_checkpoints(tabular, tmp_path):
    calls = []

    class Recorder(TrainingHook):
        def on_train_begin(self, facts):
            calls.append(("begin", facts.start_step, facts.global_batch_size))

        def on_loop_end(self, step, metrics):
            calls.append(("loop", step, sorted(metrics)))

        def on_checkpoint(self, step, path):
            calls.append(("ckpt", step, os.path.basename(path)))

        def on_train_end(self, result):
            calls.append(("end", result.steps_completed, None))

    result = _run(
        tabular,
        tmp_path,
        hooks=[Recorder()],
        steps_per_loop=15,
        checkpoint_every_steps=20,
        profile_steps=(5, 8),
        warmup_steps=10,
    )
    kinds = [(c[0], c[1]) for c in calls]
    # Loops end exactly on checkpoint steps and profiler edges: 5, 8, 20 (ckpt), 35, 40.
    assert kinds == [
        ("begin", 0),
        ("loop", 5),
        ("loop", 8),
        ("loop", 20),
        ("ckpt", 20),
        ("loop", 35),
        ("loop", 40),
        ("ckpt", 40),
        ("end", 40),
    ]
    assert calls[0][2] == 32
    assert {
        "step",
        "loss",
        "learning_rate",
        "examples_per_second",
        "input_wait_fraction",
        "loss_scale",
        "step_time",
    } <= set(calls[1][2])
    # Warm-up: 5 updates done at the first record -> lr = peak * 6/10 for the next update.
    peak = 5e-3 * 32 / 64
    assert result.facts.learning_rate == pytest.approx(peak)
    assert result.history[0]["learning_rate"] == pytest.approx(peak * 6 / 10, rel=1e-5)
    assert result.history[-1]["learning_rate"] == pytest.approx(peak, rel=1e-5)

    tags = set()
    log_dir = tmp_path / "logs" / "train"
    for name in os.listdir(log_dir):
        for event in tf.compat.v1.train.summary_iterator(str(log_dir / name)):
            tags.update(v.tag for v in event.summary.value)
    assert {
        "train/loss",
        "train/learning_rate",
        "train/examples_per_second",
        "train/step_time",
        "train/input_wait_fraction",
        "eval/loss",
        "eval/accuracy",
    } <= tags
    profile_files = [f for _, _, fs in os.walk(tmp_path / "profile") for f in fs]
    assert any(f.endswith(".xplane.pb") for f in profile_files), profile_files
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-40")

    # Rerunning on the finished work_dir restores step 40 and trains no further.
    again = _run(tabular, tmp_path, steps_per_loop=15, checkpoint_every_steps=20)
    assert again.facts.start_step == 40 and again.steps_completed == 40 and again.history == ()
    for a, b in zip(again.model.get_weights(), result.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_missing_text_column_in_data_is_a_clear_error(tabular, tmp_path):
    # The spec promises a text column the TFRecords do not have: parse fails -> InputDataError.
    _, train_files, _ = tabular
    inputs = text_inputs()
    with pytest.raises(InputDataError, match="tokens"):
        train(
            config=TrainingConfig(per_replica_batch_size=8, train_steps=2, steps_per_loop=1),
            model_inputs=inputs,
            feature_spec=feature_spec(inputs),
            train_files=train_files,
            eval_files=[],
            work_dir=str(tmp_path),
        )
    # ... and a spec that lacks it is refused before any training.
    spec = feature_spec(inputs)
    del spec["tokens"]
    with pytest.raises(InputDataError, match="text column 'tokens'"):
        train(
            config=TrainingConfig(),
            model_inputs=inputs,
            feature_spec=spec,
            train_files=train_files,
            eval_files=[],
            work_dir=str(tmp_path),
        )


BATCH = 1024


def _wait_fraction(dataset, steps=8):
    """Run the real TrainLoop on a one-device strategy over ``dataset``; return wait/wall."""
    inputs = tabular_inputs()
    # A step of a few ms (not a toy 0.3 ms one), so get_next's fixed cost of ~0.1-0.2 ms on a
    # prefetched iterator is small next to it, as it is in real training.
    config = TrainingConfig(models={"tabular": {"hidden_units": (512, 512)}}, precision="float32")
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = build_model(inputs, config)
        optimizer = create_optimizer(config, 1e-3, "float32")
        optimizer.build(model.trainable_variables)
    loop = TrainLoop(strategy, model, optimizer, config, BatchSizes(BATCH, 1, 1))
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    loop.train_loop(iterator, tf.constant(2, tf.int64))  # trace + warm up
    t0 = time.perf_counter()
    loop.train_loop(iterator, tf.constant(steps, tf.int64))
    wall = time.perf_counter() - t0
    wait = float(loop.input_wait.numpy())
    return wait / wall, wait, wall


def test_input_wait_fraction_is_measured_not_guessed():
    rng = np.random.default_rng(0)
    features = {
        "x0": rng.normal(size=BATCH).astype(np.float32),
        "x1": rng.normal(size=BATCH).astype(np.float32),
        "x2": rng.normal(size=BATCH).astype(np.float32),
        "cat": rng.integers(0, 5, size=BATCH),
    }
    labels = rng.integers(0, 3, size=BATCH)
    fast = tf.data.Dataset.from_tensors((features, labels)).repeat().prefetch(4)

    sleep, steps = 0.15, 8

    def slow_element(_):
        time.sleep(sleep)  # a 150 ms input pipeline per batch
        return np.int64(0)

    slow = (
        tf.data.Dataset.range(10**6)
        .map(lambda i: tf.numpy_function(slow_element, [i], tf.int64))
        .map(lambda _: (features, labels))
    )
    slow_fraction, slow_wait, _ = _wait_fraction(slow, steps)
    fast_fraction, _, fast_wall = _wait_fraction(fast, steps)
    step = fast_wall / steps  # the step's own time, input ready
    print(
        f"input wait fraction: slow pipeline {slow_fraction:.3f} ({slow_wait:.3f} s), "
        f"in-memory {fast_fraction:.3f} (step {step * 1e3:.1f} ms)"
    )
    # The next element is produced while a step computes (tf.data's injected prefetch, the
    # distributed iterator's buffer), so each step waits at least sleep - step; the first may
    # find one element ready. The step took ~5-15 ms on an AVX512 EPYC and 36-42 ms on an
    # AVX2-only one: with an 80 ms sleep the latter waited 0.41 s, under 6 sleeps.
    assert slow_wait > (steps - 1) * (sleep - step), (slow_wait, step)
    assert slow_fraction > 0.6, slow_fraction
    # From memory, prefetched: waiting is a small part of the loop (not 0: on 2 busy cores the
    # prefetch thread competes with the step's compute threads; that wait is real).
    assert fast_fraction < 0.45 and fast_fraction < slow_fraction - 0.3, (
        fast_fraction,
        slow_fraction,
    )


# --- regression --------------------------------------------------------------------------------
def _regression_records(directory, rows: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Transform-shaped records whose float32 label is a known function of the features, far
    from 0 (mean ~100): y = 100 + 20 (x0 - x1 / 2) + 5 (cat - 2)."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(str(directory), "part-00000.tfrecord.gz")
    labels = []
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for _ in range(rows):
            x = rng.normal(size=3).astype(np.float32)
            cat = int(rng.integers(5))
            y = np.float32(100 + 20 * (x[0] - 0.5 * x[1]) + 5 * (cat - 2))
            labels.append(y)
            feature = {
                **{
                    f"x{i}": tf.train.Feature(float_list=tf.train.FloatList(value=[x[i]]))
                    for i in range(3)
                },
                "cat": tf.train.Feature(int64_list=tf.train.Int64List(value=[cat])),
                "label": tf.train.Feature(float_list=tf.train.FloatList(value=[y])),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())
    return [path], np.array(labels, np.float64)


@pytest.mark.parametrize(
    ("precision", "loss"), [("float32", "mse"), ("mixed_float16", "huber")], ids=["mse", "huber16"]
)
def test_regression_head_learns_a_number_and_reports_mae_and_rmse(tmp_path, precision, loss):
    from trainer_module.run import label_statistics
    from trainer_module.training import ModelInputs

    train_files, train_labels = _regression_records(tmp_path / "train", 1024, seed=0)
    eval_files, eval_labels = _regression_records(tmp_path / "eval", 256, seed=1)
    # The head's scale: the training labels' mean and standard deviation, read from the files.
    mean, std = label_statistics(train_files, "label")
    assert mean == pytest.approx(train_labels.mean(), rel=1e-5)
    assert std == pytest.approx(train_labels.std(), rel=1e-4)
    inputs = ModelInputs(
        numeric=("x0", "x1", "x2"),
        categorical={"cat": 5},
        label="label",
        task="regression",
        label_mean=mean,
        label_std=std,
    )
    spec = {f"x{i}": tf.io.FixedLenFeature([], tf.float32) for i in range(3)}
    spec["cat"] = tf.io.FixedLenFeature([], tf.int64)
    spec["label"] = tf.io.FixedLenFeature([], tf.float32)
    result = train(
        config=TrainingConfig(
            per_replica_batch_size=32,
            train_steps=300,
            steps_per_loop=50,
            learning_rate=5e-3,
            models={"tabular": {"hidden_units": (32,)}},
            dropout_rate=0.0,
            precision=precision,
            regression_loss=loss,
            huber_delta=5.0,
        ),
        model_inputs=inputs,
        feature_spec=spec,
        train_files=train_files,
        eval_files=eval_files,
        work_dir=str(tmp_path / "work"),
    )
    _loss_fell(result, factor=0.5)
    metrics = result.eval_metrics
    assert set(metrics) == {"loss", "mae", "rmse", "examples"}
    assert metrics["examples"] == 256
    # Always answering the mean would be off by ~19 on average; the model learned the relation.
    trivial = float(np.mean(np.abs(eval_labels - train_labels.mean())))
    assert metrics["mae"] < 0.25 * trivial, (metrics, trivial)
    assert metrics["mae"] <= metrics["rmse"]
    # The serving twin: float32 [batch, 1] numbers in the label's units, matching the eval MAE.
    serving = result.serving_model
    assert all(layer.dtype_policy.name == "float32" for layer in serving.layers)
    assert result.model.get_layer("prediction").dtype_policy.name == "float32"
    batch = next(
        iter(
            tf.data.TFRecordDataset(eval_files, compression_type="GZIP")
            .batch(256)
            .map(lambda r: tf.io.parse_example(r, spec))
        )
    )
    predicted = serving({k: batch[k] for k in ("x0", "x1", "x2", "cat")})
    assert predicted.dtype == tf.float32 and tuple(predicted.shape) == (256, 1)
    mae = float(np.mean(np.abs(predicted.numpy()[:, 0] - eval_labels)))
    assert mae == pytest.approx(metrics["mae"], rel=1e-3)
