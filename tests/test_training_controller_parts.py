"""The controller's pieces on their own (real TensorFlow, nothing mocked): set-up, restore, the
checkpoint cadence, the profiler window, TensorBoard summaries and evaluation. Whole runs
through ``train()`` are in test_training_loop.py."""

from __future__ import annotations

import dataclasses
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.training_data import feature_spec, tabular_inputs, write_records
from trainer_module.training import ConfigError, TrainingConfig, make_dataset, metrics
from trainer_module.training.checkpoints import (
    CheckpointAction,
    CheckpointStore,
    TracedWriteCheckpoint,
    training_checkpoint,
)
from trainer_module.training.evaluation import evaluate
from trainer_module.training.loop import TrainLoop
from trainer_module.training.profiler import ProfilerWindow
from trainer_module.training.setup import set_up
from trainer_module.training.strategy import ClusterInfo
from trainer_module.training.summaries import Summaries

CHIEF = ClusterInfo(num_workers=1, task_type=None, task_id=0, is_chief=True)


def _config(**overrides) -> TrainingConfig:
    return TrainingConfig(
        **{"per_replica_batch_size": 16, "precision": "float32", **overrides},
    )


# --- set-up ----------------------------------------------------------------------------------
def test_set_up_builds_the_model_and_optimizer_on_the_replicas_with_scaled_batch_and_rate(
    monkeypatch,
):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    config = _config(num_logical_cpu_devices=2, precision="mixed_bfloat16", seed=7)
    setup = set_up(config, tabular_inputs())
    assert isinstance(setup.strategy, tf.distribute.MirroredStrategy)
    assert setup.batch.global_batch == 32  # 16 per replica x 2 replicas
    assert setup.learning_rate == pytest.approx(1e-3 * 32 / 64)  # linear scaling from 64
    assert (setup.policy_name, setup.model_kind) == ("mixed_bfloat16", "tabular")
    assert setup.model.get_layer("dense0").compute_dtype == "bfloat16"
    # Variables live on both replicas, and the optimizer's slots exist before any step (so a
    # checkpoint restores into them).
    assert isinstance(setup.model.trainable_variables[0].value, tf.distribute.DistributedValues)
    assert len(setup.optimizer.variables) > 2 * len(setup.model.trainable_variables)
    # The seed is set before the model is built: the same config builds the same weights.
    again = set_up(config, tabular_inputs())
    for a, b in zip(setup.model.get_weights(), again.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_set_up_refuses_a_model_the_inputs_cannot_feed():
    with pytest.raises(ConfigError, match="`model` is 'transformer'"):
        set_up(_config(model="transformer"), tabular_inputs())


# --- restore ---------------------------------------------------------------------------------
def _trained_objects(seed: int):
    config = _config(seed=seed, num_logical_cpu_devices=0)
    setup = set_up(config, tabular_inputs())
    loop = TrainLoop(setup.strategy, setup.model, setup.optimizer, config, setup.batch)
    return setup, loop


@pytest.mark.parametrize("traced", [True, False], ids=["traced", "eager"])
def test_restore_reads_the_chief_checkpoint_into_a_fresh_model(tmp_path, monkeypatch, traced):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    saved, saved_loop = _trained_objects(seed=1)
    saved_loop.step.assign(7)
    saved.optimizer.iterations.assign(5)
    store = CheckpointStore(
        training_checkpoint(
            model=saved.model, optimizer=saved.optimizer, step=saved_loop.step, traced=traced
        ),
        work_dir=str(tmp_path),
        cluster=CHIEF,
        max_to_keep=3,
    )
    assert store.saves == ("traced" if traced else "eager")
    assert isinstance(store.checkpoint, TracedWriteCheckpoint) is traced
    assert store.restore_latest() is None  # nothing there yet: a fresh run
    path = store.save(7)
    assert path == os.path.join(str(tmp_path), "checkpoints", "ckpt-7")

    fresh, fresh_loop = _trained_objects(seed=2)  # other initial weights
    assert not np.array_equal(fresh.model.get_weights()[0], saved.model.get_weights()[0])
    # A non-chief worker restores the chief's checkpoint but saves to its own temporary folder.
    worker = CheckpointStore(
        training_checkpoint(
            model=fresh.model, optimizer=fresh.optimizer, step=fresh_loop.step, traced=False
        ),
        work_dir=str(tmp_path),
        cluster=ClusterInfo(2, "worker", 0, False, worker_index=1),
        max_to_keep=3,
    )
    assert worker.restore_latest() == path
    assert int(fresh_loop.step.numpy()) == 7 and int(fresh.optimizer.iterations.numpy()) == 5
    for a, b in zip(fresh.model.get_weights(), saved.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not worker.directory.startswith(str(tmp_path))
    worker.save(8)
    assert os.path.exists(os.path.join(worker.directory, "ckpt-8.index"))
    assert tf.train.latest_checkpoint(store.chief_directory) == path  # the chief's is unchanged
    worker.close()
    assert not os.path.exists(worker.directory)
    store.close()
    assert os.path.exists(path + ".index")  # the chief's checkpoints stay


# --- the checkpoint action --------------------------------------------------------------------
def _manager(tmp_path):
    checkpoint = tf.train.Checkpoint(v=tf.Variable(0.0))
    return tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=None)


def test_checkpoint_action_saves_exactly_on_cadence_steps_and_at_the_end(tmp_path):
    manager = _manager(tmp_path)
    action = CheckpointAction(
        lambda step: manager.save(checkpoint_number=step),
        train_steps=45,
        every_steps=20,
        every_seconds=None,
        start_step=0,
    )
    assert [action.steps_to_next(s) for s in (0, 5, 19, 20, 35)] == [20, 15, 1, 20, 5]
    saved = {}
    for step in (5, 8, 20, 35, 40, 45):
        path, seconds = action(step)
        assert (path is None) == (seconds == 0.0)
        if path is not None:
            saved[step] = os.path.basename(path)
            assert seconds > 0
    assert saved == {20: "ckpt-20", 40: "ckpt-40", 45: "ckpt-45"}
    assert [os.path.basename(p) for p in manager.checkpoints] == ["ckpt-20", "ckpt-40", "ckpt-45"]
    # A run restored at its end saves nothing again; without a step cadence only the end saves.
    resumed = CheckpointAction(
        manager.save, train_steps=45, every_steps=20, every_seconds=None, start_step=45
    )
    assert resumed(45) == (None, 0.0)
    end_only = CheckpointAction(
        lambda step: manager.save(checkpoint_number=step),
        train_steps=60,
        every_steps=0,
        every_seconds=None,
        start_step=45,
    )
    assert end_only.steps_to_next(50) is None
    assert end_only(50)[0] is None and end_only(60)[0].endswith("ckpt-60")


def test_checkpoint_action_by_seconds_saves_when_late_and_as_the_workers_agree(tmp_path):
    manager = _manager(tmp_path)
    now = iter([0.0, 4.0, 11.0, 11.0, 15.0, 16.0, 16.0])  # start, decisions, after saves
    asked = []

    def agree(late):  # stands in for the all-reduce: here another worker is late at step 40
        asked.append(late)
        return late or len(asked) == 4

    action = CheckpointAction(
        lambda step: manager.save(checkpoint_number=step),
        train_steps=100,
        every_steps=0,
        every_seconds=10.0,
        start_step=0,
        agree=agree,
        clock=lambda: next(now),
    )
    results = {step: action(step)[0] for step in (10, 20, 30, 40)}
    # 10: 4 s since start; 20: 11 s -> save (the clock restarts at 11); 30: 4 s; 40: 5 s, but
    # another worker was late, so every worker saves.
    assert asked == [False, True, False, False]
    assert [step for step, path in results.items() if path] == [20, 40]


# --- the profiler window ------------------------------------------------------------------------
def test_profiler_window_runs_exactly_between_its_edges(tmp_path):
    window = ProfilerWindow((5, 8), str(tmp_path / "profile"))
    assert [window.steps_to_edge(s) for s in (0, 4, 5, 6, 8, 20)] == [5, 1, 3, 2, None, None]
    window.before_loop(0)
    assert not window.active  # loop 0-5 is before the window
    window.after_loop(5)
    window.before_loop(5)
    assert window.active
    window.after_loop(7)
    assert window.active  # not at its end yet
    window.before_loop(7)
    window.after_loop(8)
    assert not window.active
    files = [f for _, _, fs in os.walk(tmp_path / "profile") for f in fs]
    assert any(f.endswith(".xplane.pb") for f in files), files
    # Not the chief: the same edges (loops stay the same length on every worker), no profiling.
    other = ProfilerWindow((5, 8), str(tmp_path / "other"), enabled=False)
    assert other.steps_to_edge(4) == 1
    other.before_loop(5)
    assert not other.active and not os.path.exists(tmp_path / "other")
    # Training that stops inside the window (divergence) still stops the profiler.
    early = ProfilerWindow((0, 100), str(tmp_path / "early"))
    early.before_loop(0)
    early.close()
    assert not early.active
    tf.profiler.experimental.start(str(tmp_path / "again"))  # raises if one were still running
    tf.profiler.experimental.stop()


# --- summaries --------------------------------------------------------------------------------
def _scalars(logdir) -> dict[str, tuple[int, float]]:
    found = {}
    for name in os.listdir(logdir):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(logdir, name)):
            for value in event.summary.value:
                # TensorBoard's scalar plugin owns it: it shows up on the Scalars tab.
                assert value.metadata.plugin_data.plugin_name == "scalars", value.tag
                found[value.tag] = (event.step, float(tf.make_ndarray(value.tensor)))
    return found


def test_summaries_write_the_named_scalars_at_the_loop_step(tmp_path):
    summaries = Summaries(str(tmp_path))
    record = {
        metrics.LOSS: 0.5,
        metrics.LEARNING_RATE: 0.01,
        metrics.EXAMPLES_PER_SECOND: 1000.0,
        metrics.STEP_TIME: 0.002,
        metrics.INPUT_WAIT_FRACTION: 0.25,
        metrics.LOSS_SCALE: None,  # not float16: no loss scale to plot
        metrics.STEPS: 10,
    }
    summaries.write_loop(record, 30)
    summaries.write_eval({metrics.EVAL_LOSS: 0.4, metrics.EVAL_ACCURACY: 0.75}, 30)
    found = _scalars(tmp_path)
    expected = {
        f"train/{key}": record[key] for key in metrics.LOOP_SCALARS if record[key] is not None
    }
    expected.update({"eval/loss": 0.4, "eval/accuracy": 0.75})
    assert set(found) == set(expected)
    for tag, value in expected.items():
        assert found[tag] == (30, pytest.approx(value)), tag


# --- evaluation -------------------------------------------------------------------------------
def test_evaluate_gives_the_models_loss_and_accuracy_over_the_eval_files(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    inputs = tabular_inputs()
    files = write_records(tmp_path / "eval", inputs, files=1, per_file=100, seed=3)
    config = _config(per_replica_batch_size=32, num_logical_cpu_devices=0)
    setup = set_up(config, inputs)
    loop = TrainLoop(setup.strategy, setup.model, setup.optimizer, config, setup.batch)
    spec = feature_spec(inputs)
    got = evaluate(
        loop,
        eval_files=files,
        feature_spec=spec,
        model_inputs=inputs,
        config=config,
        compression="GZIP",
    )
    # The same, computed from the model's probabilities by Keras and numpy.
    probs, labels = [], []
    for features, label in make_dataset(
        files, spec, inputs, config, batch_size=100, training=False
    ):
        probs.append(setup.model(features).numpy())
        labels.append(label.numpy())
    probs, labels = np.concatenate(probs), np.concatenate(labels)
    loss = keras.losses.sparse_categorical_crossentropy(labels, probs).numpy().mean()
    assert got[metrics.EVAL_EXAMPLES] == 100
    assert got[metrics.EVAL_LOSS] == pytest.approx(loss, rel=1e-5)
    assert got[metrics.EVAL_ACCURACY] == pytest.approx((probs.argmax(-1) == labels).mean())
    # eval_steps bounds the batches; no eval files, no metrics.
    bounded = dict(eval_files=files, feature_spec=spec, model_inputs=inputs, compression="GZIP")
    limited = dataclasses.replace(config, eval_steps=2)
    assert evaluate(loop, config=limited, **bounded)[metrics.EVAL_EXAMPLES] == 64
    assert evaluate(loop, config=config, **{**bounded, "eval_files": []}) == {}
