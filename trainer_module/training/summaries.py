"""TensorBoard summaries: each loop's scalars at its step, and the eval metrics at the end.

Written by the chief only; other workers get a writer that writes nothing. The tags are the
charted names of :mod:`metrics` (``train/loss``, ``eval/accuracy``), the same as in MLflow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from trainer_module.training import metrics


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
                    tf.summary.scalar(metrics.chart_name(key), record[key], step=step)

    def write_eval(self, eval_metrics: Mapping[str, float], step: int) -> None:
        """``eval/loss`` and ``eval/accuracy`` at ``step``, flushed."""
        with self._writer.as_default():
            for key in metrics.EVAL_SCALARS:
                if key in eval_metrics:
                    tf.summary.scalar(metrics.eval_chart_name(key), eval_metrics[key], step=step)
        self.flush()

    def flush(self) -> None:
        self._writer.flush()
