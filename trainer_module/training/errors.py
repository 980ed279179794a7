"""Error types raised by the training library.

Everything the library raises on purpose derives from :class:`TrainingError`, so the pipeline
can tell "the trainer refused or stopped for a stated reason" from an unexpected crash.
"""

from __future__ import annotations


class TrainingError(Exception):
    """Base class of every error the training library raises deliberately."""


class ConfigError(TrainingError, ValueError):
    """A configuration value (or a combination of values) that cannot work.

    The message names the offending field. Given as ``field``, it leads the message:
    ``ConfigError("must be > 0, got -4", field="per_replica_batch_size")`` reads
    "`per_replica_batch_size` must be > 0, got -4", and a caller that nests this config under a
    section qualifies the path from ``field`` and ``message`` without parsing the text.
    ``ConfigError(message)`` is a complete message as it stands.
    """

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(f"`{field}` {message}" if field else message)
        self.message = message
        self.field = field


class InputDataError(TrainingError, ValueError):
    """The data does not match what ``ModelInputs``/``feature_spec`` promise."""


class TrainingDivergedError(TrainingError, RuntimeError):
    """The loss became NaN or Inf; nothing was exported.

    ``step`` is the 1-based training step whose loss was non-finite.
    """

    def __init__(self, step: int, loss: float, learning_rate: float):
        self.step = step
        self.loss = loss
        self.learning_rate = learning_rate
        super().__init__(
            f"training diverged: the loss was {loss} at step {step} "
            f"(learning rate {learning_rate:g}). Nothing was exported. Lower `learning_rate` "
            "(or raise `warmup_steps`), check the transformed features for NaN/Inf values, "
            "or train in float32 (`precision='float32'`) to rule out mixed-precision overflow."
        )
