"""Periodic checkpoints without re-walking the object graph at every save.

`tf.train.Checkpoint.write`, run eagerly, walks the whole Python object graph (model, optimizer,
their layers and variables) at every save, to rebuild the list of tensors to save and the graph
proto it stores beside them. For the tabular model that walk is most of a save: measured on
2026-12-01 (AMD EPYC, 2 cores, AVX2), a `CheckpointManager.save` took 28 ms eagerly and 6.6 ms
traced (3.3 ms of it the write, the rest the manager's state file and sweep), and at the
default cadence (every 100 steps of ~0.4 ms) the eager saves were ~30% of the training time,
the traced ones ~13%. The first save pays the trace (~150 ms against ~65 ms eagerly).

`TracedWriteCheckpoint` runs the same `write` as one `tf.function`, traced at the first save: the
walk happens once, and later saves only run the traced SaveV2/MergeV2Checkpoints ops, which read
the variables' current values. The files are the same (same object graph, same keys, written by
the same ops, renamed into place by the same merge), so `restore`, `latest_checkpoint` and
`CheckpointManager` (which calls `_write` and passes its bookkeeping as write callbacks) see no
difference.

The traced function is only valid while the object graph is the one it was traced on; a
`structure_key` (for us: the number of model and optimizer variables) is compared at every save,
and a change retraces. A write with any option but CheckpointManager's callbacks (async, an I/O
device, sharding, skipped slots) goes through TF's own path.
Multi-worker runs keep TF's eager path: their saves may run collectives, and TF's multi-worker
checkpoint recipe is only tested eagerly here.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Hashable
from typing import Any

import tensorflow as tf


def _only_callbacks(options: tf.train.CheckpointOptions | None) -> bool:
    """True when `options` sets nothing but write callbacks (what CheckpointManager passes): the
    traced save is traced with default options, so any other option takes TF's own path."""
    if options is None:
        return True
    default = tf.train.CheckpointOptions()
    return all(
        getattr(options, name) == getattr(default, name)
        for name in type(default).__slots__
        if name != "experimental_write_callbacks"
    )


class _Traced:
    """The traced save and the structure key it was traced at. A plain object on purpose: a
    tf.function set as an attribute of a Checkpoint would become a node of the saved graph."""

    def __init__(self) -> None:
        self.fn: Any = None
        self.key: Hashable = None


class TracedWriteCheckpoint(tf.train.Checkpoint):
    """A `tf.train.Checkpoint` whose eager writes run one traced save (see the module)."""

    def __init__(self, *, structure_key: Callable[[], Hashable] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self._ft_structure_key = structure_key or (lambda: None)
        self._ft_traced = _Traced()
        self.traces = 0  # how many times the save was traced (1 unless the graph changed)

    def _write(self, file_prefix, options=None):  # noqa: ANN001 - TF's signature
        if not tf.executing_eagerly() or not _only_callbacks(options):
            return super()._write(file_prefix, options)
        key = self._ft_structure_key()
        if self._ft_traced.fn is None or key != self._ft_traced.key:
            parent_write = super()._write

            @tf.function(input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
            def traced(prefix):
                return parent_write(prefix, tf.train.CheckpointOptions())

            self._ft_traced.fn, self._ft_traced.key = traced, key
            self.traces += 1
        # As TrackableSaver.save does for a prefix given as a string (ours is a tensor inside).
        tf.io.gfile.makedirs(os.path.dirname(os.fspath(file_prefix)))
        path = self._ft_traced.fn(tf.constant(os.fspath(file_prefix))).numpy().decode("utf-8")
        # What Checkpoint._write does after its save (the callbacks are CheckpointManager's
        # bookkeeping: the "checkpoint" state file and the sweep of old checkpoints).
        for callback in (options.experimental_write_callbacks if options else None) or ():
            callback(*([path] if inspect.signature(callback).parameters else []))
        return path
