"""Where tracking goes, decided in one place, and the link that carries it to the Trainer.

Precedence: `tracking.uri` in the config, then `$MLFLOW_TRACKING_URI`, then the embedded default:
a SQLite store `<output_dir>/mlflow/mlflow.db` with artifacts in `<output_dir>/mlflow/artifacts/`
(no server needed; `fullthrottle ui` browses it).

The Trainer learns where to track from a `TrainerLink` in its `custom_config` (`LINK_KEY`), so
the link travels with the pipeline: in-process with `fullthrottle run`, inside the compiled spec
on Kubeflow. The link is the same on every run of a pipeline with the same tracking settings
(destination, experiment, pipeline key, retry and metric settings), because TFX's cache key
hashes every execution property (`cache_utils.get_cache_context`): a per-run value such as the
parent run's id would make the Trainer miss the cache on every run. The parent run is therefore
not in the link: the Trainer's hook finds it by the pipeline key tag (see `hook.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullthrottle.core.config import Config

STORE_DIR = "mlflow"
# The Trainer's custom_config key holding its link (a JSON object of `TrainerLink`'s fields).
LINK_KEY = "tracking"


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


def bound_http_requests(request_timeout_seconds: float) -> None:
    """MLflow's own HTTP retries default to 7 with exponential backoff (minutes against a dead
    server); we retry ourselves with the config's budget, so MLflow gets one try per call and a
    bounded timeout. Values the user set in the environment win."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(request_timeout_seconds)))


@contextlib.contextmanager
def scoped_tracking_uri(uri: str) -> Iterator[None]:
    """The process's MLflow tracking URI set to `uri` for the block. Needed where MLflow reads
    that global instead of a client's URI: logging a model (`Model.log`), and a SQL-store
    registry resolving a ``models:/`` source (MLflow's own comment there says so)."""
    import mlflow
    import mlflow.tracking

    # Restoring an unset URI by its default value would set it (and $MLFLOW_TRACKING_URI, which
    # MLflow exports for subprocesses): every later run in this process would then write to the
    # default `./mlruns`. So an unset URI is restored as unset.
    was_set = mlflow.tracking.is_tracking_uri_set()
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous if was_set else None)


def without_credentials(uri: str) -> str:
    """`uri` without a user, password or query string: what may be written into a pipeline's
    execution properties (ML Metadata, the compiled spec, the KFP UI). Credentials reach the
    Trainer the way MLflow reads them anywhere: MLFLOW_TRACKING_USERNAME / _PASSWORD / _TOKEN."""
    parts = urllib.parse.urlsplit(uri)
    if not parts.netloc:
        return uri
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def pipeline_key(pipeline_name: str, pipeline_root: str) -> str:
    """Which pipeline a parent run belongs to: its name and where it writes, hashed."""
    material = json.dumps([pipeline_name, str(pipeline_root)])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TrainerLink:
    """What the Trainer's tracking hook needs to find (or make) its runs in MLflow.

    From a pipeline: `uri`, `experiment` (a name) and `pipeline_key`; the hook attaches to the
    newest unfinished parent run with that key, or creates one (and then ends it itself) when
    there is none, as on Kubeflow. Code that made its own parent (the benchmark) gives
    `experiment_id` and `parent_run_id` instead.
    """

    uri: str
    experiment: str | None = None
    pipeline_name: str | None = None
    pipeline_key: str | None = None
    experiment_id: str | None = None
    parent_run_id: str | None = None
    status_path: str | None = None  # if set, the hook also writes its status to this file
    retries: int = 3
    retry_backoff_seconds: float = 1.0
    request_timeout_seconds: float = 15.0
    flush_timeout_seconds: float = 60.0
    system_metrics_interval_seconds: float = 5.0
    metrics_interval_seconds: float = 5.0
    points_per_curve: int = 100

    def to_config(self) -> dict[str, Any]:
        """The JSON-safe form that goes into the Trainer's custom_config (None fields left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_config(cls, value: Any) -> TrainerLink | None:
        """The link from a custom_config value; None when there is none (tracking off)."""
        if not value:
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in dict(value).items() if k in known})


def trainer_link(
    config: Config, destination: Destination, *, pipeline_root: str, experiment: str | None = None
) -> TrainerLink:
    """The link for a pipeline writing to `pipeline_root` and tracking into `destination`."""
    tracking = config.tracking
    return TrainerLink(
        uri=without_credentials(destination.uri),
        experiment=experiment or tracking.experiment or config.pipeline_name,
        pipeline_name=config.pipeline_name,
        pipeline_key=pipeline_key(config.pipeline_name, pipeline_root),
        retries=tracking.retries,
        retry_backoff_seconds=tracking.retry_backoff_seconds,
        request_timeout_seconds=tracking.request_timeout_seconds,
        flush_timeout_seconds=tracking.flush_timeout_seconds,
        system_metrics_interval_seconds=tracking.system_metrics_interval_seconds,
        metrics_interval_seconds=tracking.metrics_interval_seconds,
        points_per_curve=tracking.points_per_curve,
    )
