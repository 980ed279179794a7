"""Errors meant for people.

Every error the CLI prints without a stack trace derives from `FullthrottleError`; its message
says what was wrong, where (file, column, field, step) and what to do. Anything else is a bug and
is shown with its trace.
"""

from __future__ import annotations

from trainer_module.training.errors import ConfigError as TrainingConfigError
from trainer_module.training.errors import TrainingError


class FullthrottleError(Exception):
    """An error whose message is complete and actionable on its own."""


class ConfigError(FullthrottleError, TrainingConfigError):
    """A configuration value is missing, unknown, of the wrong type or out of range.

    It is also a `trainer_module.training.errors.ConfigError`, so one `except` catches the
    pipeline's and the training library's config errors alike.
    """


class DataError(FullthrottleError, ValueError):
    """Input data cannot be used as configured (missing file, empty, missing column...)."""


class ServingError(FullthrottleError):
    """Nothing can be served as asked (no pushed model, port taken, server unreachable...)."""


class PipelineFailedError(FullthrottleError):
    """A pipeline component failed; the message names the component and the cause."""


# Errors the CLI prints as a message (no stack trace): ours and the training library's.
USER_ERRORS: tuple[type[BaseException], ...] = (FullthrottleError, TrainingError)
