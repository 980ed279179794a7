"""Set-up: strategy, determinism and seed, precision policy, batch arithmetic, model, optimizer.

Owns the order these must happen in: the strategy first (multi-worker collectives must be
configured before TensorFlow initialises), then op determinism and the seed (the same initial
weights on every replica and worker), then the model and optimizer inside the strategy's scope,
with the optimizer's slots built so a checkpoint restores into existing variables (Keras 3
optimizers do not support deferred restore). Refuses (before any TensorFlow work) a model that
the inputs cannot feed, and a global batch that does not split over the replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import tensorflow as tf

from trainer_module.training.config import (
    BatchSizes,
    ModelInputs,
    TrainingConfig,
    resolve_batch_sizes,
    scaled_learning_rate,
)
from trainer_module.training.models import build_model
from trainer_module.training.optimization import create_optimizer
from trainer_module.training.precision import resolve_precision_policy
from trainer_module.training.strategy import ClusterInfo, cluster_info, create_strategy


@dataclass(frozen=True)
class TrainingSetup:
    """What training runs on, resolved once per run."""

    strategy: tf.distribute.Strategy
    cluster: ClusterInfo
    policy_name: str
    policy_reason: str
    batch: BatchSizes
    learning_rate: float  # the peak learning rate, scaled for the global batch
    model_kind: str
    model: keras.Model  # the training graph (build_model(..., training=True))
    optimizer: keras.optimizers.Optimizer  # built: its slot variables exist


def set_up(config: TrainingConfig, model_inputs: ModelInputs) -> TrainingSetup:
    """Build the strategy, model and optimizer ``config`` asks for on this machine."""
    model_kind = config.resolved_model(model_inputs)
    cluster = cluster_info()
    strategy = create_strategy(config)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()  # process-wide and irreversible (TF)
    keras.utils.set_random_seed(config.seed)
    policy_name, policy_reason = resolve_precision_policy(config)
    batch = resolve_batch_sizes(config, strategy.num_replicas_in_sync)
    learning_rate = scaled_learning_rate(config, batch.global_batch)
    with strategy.scope():
        model = build_model(model_inputs, config, policy_name, training=True)
        optimizer = create_optimizer(config, learning_rate, policy_name)
        optimizer.build(model.trainable_variables)
    return TrainingSetup(
        strategy=strategy,
        cluster=cluster,
        policy_name=policy_name,
        policy_reason=policy_reason,
        batch=batch,
        learning_rate=learning_rate,
        model_kind=model_kind,
        model=model,
        optimizer=optimizer,
    )
