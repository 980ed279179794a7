"""Errors meant for people.

Every error the CLI prints without a stack trace is in `USER_ERRORS`: ours derive from
`FullthrottleError`, the training library's from `TrainingError`. The message says what was
wrong, where (file, column, field, step) and what to do. Anything else is a bug and is shown with
its trace.

`ConfigError` is the training library's, the lowest layer that raises it: one class for a bad
value in `TrainingConfig` and in the pipeline's config. Its `field` carries the field path, so the
config layer qualifies it (`per_replica_batch_size` -> `training.per_replica_batch_size`).
"""

from __future__ import annotations

from trainer_module.training.errors import ConfigError, TrainingError

__all__ = [
    "USER_ERRORS",
    "ConfigError",
    "DataError",
    "FullthrottleError",
    "PipelineFailedError",
    "TrainingError",
]


class FullthrottleError(Exception):
    """An error whose message is complete and actionable on its own."""


class DataError(FullthrottleError, ValueError):
    """Input data cannot be used as configured (missing file, empty, missing column...)."""


class ServingError(FullthrottleError):
    """Nothing can be served as asked (no pushed model, port taken, server unreachable...)."""


class PipelineFailedError(FullthrottleError):
    """A pipeline component failed; the message names the component and the cause."""


# Errors the CLI prints as a message (no stack trace): ours and the training library's.
USER_ERRORS: tuple[type[BaseException], ...] = (FullthrottleError, TrainingError)
