"""The real ``train()`` run the way the tracking and checkpoint benchmarks time it.

`train_tracked(train_kwargs, tracking_uri=...)` runs the training library's `train()` once in a
fresh work dir, with the MLflow hook attached to a fresh parent run (or without any hook when
`tracking_uri` is None), and returns the wall seconds and the result; the benchmarks
(``fullthrottle.bench.trainer.tracking_rates``, ``checkpoint_rates``) alternate such runs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from fullthrottle.tracking.store import TrainerLink


def link_for_new_run(
    tracking_uri: str,
    *,
    experiment: str = "fullthrottle-bench",
    status_dir: str | None = None,
    system_metrics_interval_seconds: float = 5.0,
) -> TrainerLink:
    """A parent run in `tracking_uri` for a bare `train()` call (no pipeline around it)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    parent = client.create_run(experiment_id, run_name="bench")
    status_dir = status_dir or tempfile.mkdtemp(prefix="fullthrottle-bench-")
    return TrainerLink(
        uri=tracking_uri,
        experiment_id=experiment_id,
        parent_run_id=parent.info.run_id,
        status_path=os.path.join(status_dir, "trainer_tracking_status.json"),
        retries=3,
        retry_backoff_seconds=1.0,
        flush_timeout_seconds=60.0,
        system_metrics_interval_seconds=system_metrics_interval_seconds,
    )


def train_tracked(
    train_kwargs: Mapping[str, Any],
    *,
    tracking_uri: str | None,
    tracking_hooks: list[Any] | None = None,
) -> tuple[float, Any]:
    """Runs `train(**train_kwargs)` (a fresh `work_dir` each time) with or without tracking.
    The MLflow hook it attaches is appended to `tracking_hooks` when given (its `cpu` meter)."""
    from fullthrottle.tracking.hook import MlflowTrainingHook
    from trainer_module.training import train

    kwargs = dict(train_kwargs)
    work_dir = tempfile.mkdtemp(prefix="fullthrottle-bench-work-")
    kwargs["work_dir"] = work_dir
    hooks = list(kwargs.pop("hooks", ()))
    if tracking_uri is not None:
        # The status file goes into the work dir, removed below with it.
        hooks.append(MlflowTrainingHook(link_for_new_run(tracking_uri, status_dir=work_dir)))
        if tracking_hooks is not None:
            tracking_hooks.append(hooks[-1])
    try:
        start = time.perf_counter()
        result = train(**kwargs, hooks=hooks)
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return seconds, result
