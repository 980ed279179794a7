"""TracedWriteCheckpoint: the Trainer's periodic saves run one traced write instead of walking the
object graph eagerly each time. The saves must still hold each save's current values, keep
CheckpointManager's bookkeeping, write what an eager save writes, and follow a changed graph.
(Resume after a kill, through the real `train()`, is tests/test_training_resume.py.)"""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf

from trainer_module.training.checkpoints import TracedWriteCheckpoint


def _objects():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    return model, optimizer, tf.Variable(0, dtype=tf.int64)


def _fill(model, step, value: float) -> None:
    for i, v in enumerate(model.trainable_variables):
        v.assign(np.full(v.shape, value + i, dtype="float32"))
    step.assign(int(value))


def test_each_save_holds_the_values_at_its_own_time_and_the_manager_keeps_its_books(tmp_path):
    model, optimizer, step = _objects()
    checkpoint = TracedWriteCheckpoint(
        structure_key=lambda: (len(model.variables), len(optimizer.variables)),
        model=model,
        optimizer=optimizer,
        step=step,
    )
    directory = tmp_path / "ckpts"  # not there yet: the first save makes it, as TF's does
    manager = tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=2)
    paths = []
    for n in (10, 20, 30):
        _fill(model, step, float(n))
        paths.append(manager.save(checkpoint_number=n))
    assert checkpoint.traces == 1  # traced at the first save, reused after
    assert tf.train.latest_checkpoint(str(directory)) == paths[-1]
    assert manager.checkpoints == paths[1:]  # max_to_keep swept ckpt-10
    assert not any(name.startswith("ckpt-10.") for name in os.listdir(directory))

    # Restored by a plain tf.train.Checkpoint: the traced save wrote the values of its own time,
    # not those when it was traced.
    fresh_model, fresh_optimizer, fresh_step = _objects()
    plain = tf.train.Checkpoint(model=fresh_model, optimizer=fresh_optimizer, step=fresh_step)
    plain.restore(paths[1]).assert_existing_objects_matched()
    assert int(fresh_step.numpy()) == 20
    for i, v in enumerate(fresh_model.trainable_variables):
        np.testing.assert_array_equal(v.numpy(), np.full(v.shape, 20.0 + i, dtype="float32"))


def test_a_traced_save_writes_what_an_eager_save_writes(tmp_path):
    model, optimizer, step = _objects()
    _fill(model, step, 3.0)
    traced = TracedWriteCheckpoint(model=model, optimizer=optimizer, step=step)
    eager = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    # Through CheckpointManager, as the Trainer saves (its save_counter included), twice: the
    # second save runs the function the first one traced.
    for checkpoint, folder in ((traced, "traced"), (eager, "eager")):
        manager = tf.train.CheckpointManager(checkpoint, str(tmp_path / folder), max_to_keep=3)
        manager.save(checkpoint_number=1)
        _fill(model, step, 4.0)
        manager.save(checkpoint_number=2)
        _fill(model, step, 3.0)
    a, b = str(tmp_path / "traced" / "ckpt-2"), str(tmp_path / "eager" / "ckpt-2")
    assert traced.traces == 1
    assert "save_counter/.ATTRIBUTES/VARIABLE_VALUE" in dict(tf.train.list_variables(a))
    assert tf.train.list_variables(a) == tf.train.list_variables(b)
    reader_a, reader_b = tf.train.load_checkpoint(a), tf.train.load_checkpoint(b)
    for name, _ in tf.train.list_variables(b):
        np.testing.assert_array_equal(reader_a.get_tensor(name), reader_b.get_tensor(name))


def test_a_changed_object_graph_is_traced_again_and_saved_whole(tmp_path):
    extra = tf.Module()
    extra.values = []
    checkpoint = TracedWriteCheckpoint(
        structure_key=lambda: len(extra.values), extra=extra, step=tf.Variable(1)
    )
    checkpoint.write(str(tmp_path / "a" / "ckpt"))
    extra.values.append(tf.Variable([1.0, 2.0]))  # a variable created after the first save
    path = checkpoint.write(str(tmp_path / "b" / "ckpt"))
    assert checkpoint.traces == 2
    names = [name for name, _ in tf.train.list_variables(path)]
    assert any(name.startswith("extra/values/0/") for name in names), names

    # The same change with no key to see it would be missed: the check is what catches it.
    blind_extra = tf.Module()
    blind_extra.values = []
    blind = TracedWriteCheckpoint(extra=blind_extra, step=tf.Variable(1))
    blind.write(str(tmp_path / "c" / "ckpt"))
    blind_extra.values.append(tf.Variable([1.0]))
    stale = blind.write(str(tmp_path / "d" / "ckpt"))
    assert blind.traces == 1
    assert not any(name.startswith("extra/values/0/") for name, _ in tf.train.list_variables(stale))


def test_a_write_with_options_of_its_own_takes_tfs_path(tmp_path):
    step = tf.Variable(5)
    checkpoint = TracedWriteCheckpoint(step=step)
    options = tf.train.CheckpointOptions(experimental_io_device="/job:localhost")
    path = checkpoint.write(str(tmp_path / "ckpt"), options=options)
    assert checkpoint.traces == 0  # TF's eager write, with the caller's options
    assert tf.train.load_checkpoint(path).get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 5
    checkpoint.write(str(tmp_path / "again"))
    assert checkpoint.traces == 1  # no options: the traced save
