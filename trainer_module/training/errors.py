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
    "`per_replica_batch_size` must be > 0, got -4"; or it stands where the message says
    ``{field}``: ``ConfigError("unknown config key {field}", field="models.transformer.dmodel")``.
    A caller that nests this config under a section qualifies the path with
    :meth:`text` (``error.text("training." + error.field)``) without parsing the message.
    ``ConfigError(message)`` is a complete message as it stands.
    """

    def __init__(self, message: str, *, field: str | None = None):
        self.message = message
        self.field = field
        super().__init__(self.text(field))

    def text(self, field: str | None) -> str:
        """The message with ``field`` as the offending field's path."""
        if field is None:
            return self.message
        if "{field}" in self.message:
            return self.message.replace("{field}", f"`{field}`")
        return f"`{field}` {self.message}"


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


class CheckpointUnreadableError(TrainingError, RuntimeError):
    """Checkpoints exist but none of them can be read; training does not start over unless the
    config says so (``unreadable_checkpoints="start_over"``)."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the run. A ``KeyboardInterrupt``, so code that already cleans up
    after Ctrl-C does so for SIGTERM too, and TFX's launcher (which records ``Exception`` as a
    failed execution) leaves the execution unfinished, as after a kill: the rerun executes it
    again. ``signum`` is the signal (None when another worker asked to stop)."""

    def __init__(self, signum: int | None, message: str = "") -> None:
        self.signum = signum
        super().__init__(message or f"interrupted by signal {signum}")


class TrainingInterrupted(Interrupted):
    """Training stopped between two loops on a signal, after saving checkpoint ``checkpoint``
    (a prefix, or None when no worker saved it here) at ``step``."""

    def __init__(self, signum: int | None, *, step: int, checkpoint: str | None) -> None:
        self.step = step
        self.checkpoint = checkpoint
        saved = f"checkpoint {checkpoint}" if checkpoint else "no checkpoint"
        super().__init__(signum, f"training stopped at step {step} ({saved})")
