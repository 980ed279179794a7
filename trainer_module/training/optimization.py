"""Optimizer and learning-rate schedule.

The schedule is a pure function of the optimizer's own ``iterations`` variable (Keras passes it
in), and that variable is in the checkpoint, so a restored run resumes at exactly the same point
of warm-up. Note: with float16 loss scaling, skipped steps do not advance ``iterations`` (no
update happened), matching tf.keras behaviour.
"""

from __future__ import annotations

import keras
from keras import ops

from trainer_module.training.config import TrainingConfig
from trainer_module.training.precision import wrap_optimizer


class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from lr/warmup_steps to lr over ``warmup_steps`` updates, then constant."""

    def __init__(self, learning_rate: float, warmup_steps: int):
        self.learning_rate = float(learning_rate)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        lr = ops.convert_to_tensor(self.learning_rate, "float32")
        if self.warmup_steps <= 0:
            return lr
        # step counts completed updates, so the first update uses 1/warmup of the peak.
        frac = (ops.cast(step, "float32") + 1.0) / float(self.warmup_steps)
        return lr * ops.minimum(frac, 1.0)

    def get_config(self):
        return {"learning_rate": self.learning_rate, "warmup_steps": self.warmup_steps}


def create_optimizer(
    config: TrainingConfig, learning_rate: float, policy_name: str
) -> keras.optimizers.Optimizer:
    """Build the configured optimizer (call inside ``strategy.scope()``)."""
    schedule = WarmupSchedule(learning_rate, config.warmup_steps)
    if config.optimizer == "adam":
        opt = keras.optimizers.Adam(schedule)
    elif config.optimizer == "adamw":
        opt = keras.optimizers.AdamW(schedule)
    elif config.optimizer == "sgd":
        opt = keras.optimizers.SGD(schedule, momentum=0.9)
    else:
        opt = keras.optimizers.RMSprop(schedule)
    return wrap_optimizer(opt, policy_name, config)


def current_learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    """The learning rate the next update will use (host value; a sync point, call per loop)."""
    return float(ops.convert_to_numpy(optimizer.learning_rate))
