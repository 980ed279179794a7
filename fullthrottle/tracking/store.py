"""Where tracking goes, decided in one place.

Precedence: `tracking.uri` in the config, then `$MLFLOW_TRACKING_URI`, then the embedded default:
a SQLite store `<output_dir>/mlflow/mlflow.db` with artifacts in `<output_dir>/mlflow/artifacts/`
(no server needed; `fullthrottle ui` browses it). The Trainer learns the destination and the
parent run from one environment variable set by `fullthrottle run` (see `TRAINER_ENV`), because
anything put into the Trainer's `custom_config` would change its cache key on every run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullthrottle.core.config import Config

# JSON describing the parent run for the in-process Trainer (set only while the pipeline runs).
TRAINER_ENV = "FULLTHROTTLE_TRACKING"
STORE_DIR = "mlflow"


@dataclass(frozen=True)
class Destination:
    """A resolved tracking destination."""

    uri: str  # tracking (and registry) URI
    artifact_root: (
        str | None
    )  # set for the embedded store: experiments created here keep artifacts there
    embedded: bool

    @property
    def is_remote(self) -> bool:
        return self.uri.startswith(("http://", "https://", "databricks"))


def embedded_destination(output_path: Path) -> Destination:
    store = output_path / STORE_DIR
    return Destination(
        uri=f"sqlite:///{store / 'mlflow.db'}",
        artifact_root=(store / "artifacts").as_uri(),
        embedded=True,
    )


def resolve_destination(config: Config, environ: Any = None) -> Destination:
    """The config's URI, else $MLFLOW_TRACKING_URI, else the embedded store of `config.output_dir`."""
    environ = os.environ if environ is None else environ
    uri = config.tracking.uri or environ.get("MLFLOW_TRACKING_URI") or None
    if uri is None:
        return embedded_destination(config.output_path)
    return Destination(uri=uri, artifact_root=None, embedded=False)


def prepare_store(destination: Destination) -> None:
    """Creates the embedded store's folder (SQLite creates the file, not its parents)."""
    if destination.embedded:
        Path(destination.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)


def bound_http_requests(config: Config) -> None:
    """MLflow's own HTTP retries default to 7 with exponential backoff (minutes against a dead
    server); we retry ourselves with the config's budget, so MLflow gets one try per call and a
    bounded timeout. Values the user set in the environment win."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault(
        "MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(config.tracking.request_timeout_seconds))
    )


@dataclass(frozen=True)
class TrainerLink:
    """What the Trainer's tracking hook needs to attach to the pipeline's MLflow run."""

    uri: str
    experiment_id: str
    parent_run_id: str
    status_path: str  # the hook writes its tracking status here for the run summary
    retries: int
    retry_backoff_seconds: float
    flush_timeout_seconds: float
    system_metrics_interval_seconds: float
    # Default: an env link written by an older fullthrottle still parses.
    metrics_interval_seconds: float = 5.0
    metrics_resolution_seconds: float = 1.0

    def to_env(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_env(cls, environ: Any = None) -> TrainerLink | None:
        environ = os.environ if environ is None else environ
        raw = environ.get(TRAINER_ENV)
        if not raw:
            return None
        return cls(**json.loads(raw))
