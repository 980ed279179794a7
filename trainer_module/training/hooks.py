"""The observer interface the controller calls on the chief: ``TrainingHook``."""

from __future__ import annotations

from typing import Any

from trainer_module.training.results import RunFacts, TrainResult


class TrainingHook:
    """Observer of a training run; every method is a no-op. Called on the chief only, from the
    host between loops (never inside compiled code), so a hook may block but then slows
    training by exactly that much. Exceptions propagate and stop the run."""

    def on_train_begin(self, facts: RunFacts) -> None:
        """Once, after restore, before the first loop."""

    def on_loop_end(self, step: int, record: dict[str, Any]) -> None:
        """After each N-step loop; ``record`` is a copy of the loop's history record (keys in
        :mod:`metrics`)."""

    def on_checkpoint(self, step: int, path: str) -> None:
        """After a checkpoint was written (``path`` is its prefix)."""

    def on_interrupt(self, step: int, checkpoint: str | None) -> None:
        """Once, when a signal stopped training after the loop that ended at ``step`` and its
        checkpoint (``checkpoint``, a prefix) was written; :meth:`on_train_end` is not called."""

    def on_train_end(self, result: TrainResult) -> None:
        """Once, after eval and building the serving model (not called on divergence)."""
