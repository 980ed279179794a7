"""Evaluation after training: the compiled eval loop over the eval files, once (or
``eval_steps`` batches), as mean loss, accuracy (regression: mean absolute error and root mean
squared error) and the number of examples."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import tensorflow as tf

from trainer_module.training import metrics
from trainer_module.training.config import ModelInputs, TrainingConfig
from trainer_module.training.inputs import make_distributed_dataset
from trainer_module.training.loop import TrainLoop

# "Until the data ends": the eval loop stops at the end of the data before this many batches.
_UNBOUNDED_STEPS = 2**62


def evaluate(
    loop: TrainLoop,
    *,
    eval_files: Sequence[str],
    feature_spec: Mapping[str, tf.io.FixedLenFeature],
    model_inputs: ModelInputs,
    config: TrainingConfig,
    compression: str | None,
) -> dict[str, float]:
    """Eval metrics (``metrics.EVAL_*``) of ``loop``'s model; {} without eval files or
    examples. Every worker must call it (the eval loop all-reduces its sums)."""
    if not eval_files:
        return {}
    dataset = make_distributed_dataset(
        loop.strategy,
        eval_files,
        feature_spec,
        model_inputs,
        config,
        per_replica_batch_size=loop.batch.per_replica,
        training=False,
        compression=compression,
    )
    max_steps = config.eval_steps or _UNBOUNDED_STEPS
    loss_sum, first, second, count = (
        float(v) for v in loop.eval_loop(iter(dataset), tf.constant(max_steps, tf.int64))
    )
    if not count:
        return {}
    if loop.regression:
        return {
            metrics.EVAL_LOSS: loss_sum / count,
            metrics.EVAL_MAE: first / count,
            metrics.EVAL_RMSE: math.sqrt(second / count),
            metrics.EVAL_EXAMPLES: count,
        }
    return {
        metrics.EVAL_LOSS: loss_sum / count,
        metrics.EVAL_ACCURACY: first / count,
        metrics.EVAL_EXAMPLES: count,
    }
