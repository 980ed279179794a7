"""MLflow tracking for fullthrottle runs (see docs/tracking.md).

`fullthrottle run` calls `start_tracking` before the pipeline, runs it inside
`tracking_environment` (which links the in-process Trainer's hook to the pipeline's run) and
calls `finish_tracking` with the run's summary and outcome after it; the returned status goes
into last_run.json's `tracking` section. The Trainer adds `trainer_hooks()` to its hook list.
Nothing here raises because tracking failed: failures end up in that status and in the CLI's
exit message. mlflow is imported only when tracking is on.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fullthrottle.core.config import Config
    from fullthrottle.outcome import RunOutcome
    from fullthrottle.tracking.pipeline_run import PipelineTracker


def start_tracking(
    config: Config, *, source_files: tuple[str, ...], code_fingerprint: str
) -> PipelineTracker | None:
    """Starts (or re-attaches) the pipeline's MLflow run; None when `tracking.enabled` is false."""
    if not config.tracking.enabled:
        return None
    from fullthrottle.tracking.pipeline_run import start_tracking as start

    return start(config, source_files=source_files, code_fingerprint=code_fingerprint)


@contextlib.contextmanager
def tracking_environment(tracker: PipelineTracker | None) -> Iterator[None]:
    if tracker is None:
        yield
        return
    with tracker.trainer_environment():
        yield


def finish_tracking(
    tracker: PipelineTracker | None,
    summary: dict[str, Any],
    outcome: RunOutcome | None,
    *,
    error: BaseException | None,
) -> dict[str, Any]:
    """Logs the run's outcome and ends the MLflow run; returns the tracking status for the
    caller's summary (`last_run.json`'s `tracking`). Writes no file of its own."""
    if tracker is None:
        return {"enabled": False}
    return tracker.finish(summary, outcome, error=error)


def tracking_message(status: dict[str, Any], prefix: str = "") -> str:
    """One line on tracking for the CLI: where the run is, or that tracking is incomplete."""
    if not status.get("enabled"):
        return ""
    if status.get("complete"):
        return f"{prefix}Tracked in MLflow run {status['run_id']} at {status['uri']}."
    failures = status.get("failures") or []
    first = f" First failure: {failures[0]}." if failures else ""
    return (
        f"{prefix}Warning: MLflow tracking is INCOMPLETE (run {status.get('run_id')} at {status.get('uri')}: "
        f"{len(failures)} failed calls, {status.get('dropped_metric_points', 0)} metric points not recorded).{first} "
        "Training and the push were not affected; see `tracking` in last_run.json."
    )


def trainer_hooks() -> list[Any]:
    """The Trainer's tracking hooks: one MLflow hook when `fullthrottle run` linked a parent run."""
    from fullthrottle.tracking.store import TRAINER_ENV

    if not os.environ.get(TRAINER_ENV):
        return []
    from fullthrottle.tracking.hook import trainer_hooks as hooks

    return hooks()
