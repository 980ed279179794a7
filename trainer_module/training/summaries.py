"""TensorBoard summaries: each loop's scalars at its step, and the eval metrics at the end.

Written by the chief only; other workers get a writer that writes nothing. The names are those
of :mod:`metrics`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from trainer_module.training import metrics

# The `tensorboard` package (which implements tf.summary.scalar) is not in the locked
# environment; tf.summary.write with the scalar plugin's metadata writes the identical event.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
)


def _scalar(name: str, value: float, step: int) -> None:
    tf.summary.write(name, tf.constant(value, tf.float32), step=step, metadata=_SCALAR_METADATA)


class Summaries:
    """A TensorBoard event writer for ``logdir`` (None: a writer that writes nothing)."""

    def __init__(self, logdir: str | None):
        self._writer = (
            tf.summary.create_file_writer(logdir)
            if logdir is not None
            else tf.summary.create_noop_writer()
        )

    def write_loop(self, record: Mapping[str, Any], step: int) -> None:
        """The loop record's scalars (``metrics.LOOP_SCALARS``; a None value is skipped)."""
        with self._writer.as_default():
            for key in metrics.LOOP_SCALARS:
                if record.get(key) is not None:
                    _scalar(key, record[key], step)

    def write_eval(self, eval_metrics: Mapping[str, float], step: int) -> None:
        """``eval_loss`` and ``eval_accuracy`` at ``step``, flushed."""
        with self._writer.as_default():
            for key in metrics.EVAL_SCALARS:
                if key in eval_metrics:
                    _scalar(metrics.eval_metric_name(key), eval_metrics[key], step)
        self.flush()

    def flush(self) -> None:
        self._writer.flush()
