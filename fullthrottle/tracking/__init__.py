"""MLflow tracking for fullthrottle runs (see docs/tracking.md).

`fullthrottle run` calls `start_tracking` before the pipeline, gives the Trainer the tracker's
`trainer_link()` in its custom_config (`LINK_KEY`), and calls `finish_tracking` with the run's
summary and outcome after it; the returned status goes into last_run.json's `tracking` section.
A pipeline compiled for Kubeflow carries `remote_trainer_link(...)` instead. The Trainer adds
`trainer_hooks(...)` to its hook list and puts `trainer_tracking_status(...)` in its summary.
Nothing here raises because tracking failed: failures end up in that status and in the CLI's
exit message. mlflow is imported only when tracking is on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fullthrottle.tracking.store import LINK_KEY

if TYPE_CHECKING:
    from fullthrottle.core.config import Config
    from fullthrottle.outcome import RunOutcome
    from fullthrottle.tracking.pipeline_run import PipelineTracker

__all__ = [
    "LINK_KEY",
    "finish_tracking",
    "remote_trainer_link",
    "start_tracking",
    "tracking_message",
    "trainer_hooks",
    "trainer_tracking_status",
]


def start_tracking(
    config: Config, *, source_files: tuple[str, ...], code_fingerprint: str
) -> PipelineTracker | None:
    """Starts (or re-attaches) the pipeline's MLflow run; None when `tracking.enabled` is false."""
    if not config.tracking.enabled:
        return None
    from fullthrottle.tracking.pipeline_run import start_tracking as start

    return start(config, source_files=source_files, code_fingerprint=code_fingerprint)


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


def remote_trainer_link(config: Config, *, pipeline_root: str) -> dict[str, Any] | None:
    """The Trainer's link for a pipeline compiled to run elsewhere (Kubeflow), for its
    custom_config; None when tracking is off or only the embedded store is configured (a file on
    this machine: the pods cannot reach it). The destination is `tracking.uri`, else
    $MLFLOW_TRACKING_URI, as for `fullthrottle run`."""
    if not config.tracking.enabled:
        return None
    from fullthrottle.tracking.store import resolve_destination, trainer_link

    destination = resolve_destination(config)
    if destination.embedded:
        return None
    return trainer_link(config, destination, pipeline_root=pipeline_root).to_config()


def trainer_hooks(
    link_config: Mapping[str, Any] | None, *, run_params: Mapping[str, Any] | None = None
) -> list[Any]:
    """The Trainer's tracking hooks: one MLflow hook when its custom_config carries a link.

    `run_params` (the Trainer's config) are logged on a pipeline run the hook has to make
    itself, where no `fullthrottle run` made one (Kubeflow)."""
    if not link_config:
        return []
    from fullthrottle.tracking.hook import trainer_hooks as hooks

    return hooks(link_config, run_params=run_params)


def trainer_tracking_status(hooks: Sequence[Any]) -> dict[str, Any] | None:
    """What the Trainer's MLflow hook got through (for the Trainer's run summary), or None."""
    for hook in hooks:
        status = getattr(hook, "status", None)
        if callable(status):
            return status()
    return None
