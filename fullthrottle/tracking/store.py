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
import shutil
import sqlite3
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullthrottle.core.config import Config
from fullthrottle.core.paths import user_cache_dir

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
    """Creates the embedded store's folder (SQLite creates the file, not its parents) and, when
    the store does not exist yet, the store itself from an empty one (`seed_sqlite_store`)."""
    if destination.embedded:
        database = Path(destination.uri.removeprefix("sqlite:///"))
        database.parent.mkdir(parents=True, exist_ok=True)
        seed_sqlite_store(database, destination.artifact_root)


def seed_sqlite_store(database: Path, artifact_root: str | None) -> None:
    """Makes `database`, when it does not exist, a copy of an empty MLflow store of this MLflow
    version: MLflow creates a new SQLite store by running each of its schema migrations, seconds
    of every first run in a folder (and of every tracking server on a new store), while a copy
    takes milliseconds. The empty store is made once, by MLflow itself, in the user's cache
    (`user_cache_dir`); its Default experiment (id 0) gets this store's artifact folder (when
    MLflow creates a store, it is the working directory's `mlruns/0`). An existing file is
    never replaced; without a writable cache, MLflow creates the store as usual."""
    if database.exists():
        return
    try:
        template = _empty_store()
    except (OSError, sqlite3.Error):
        return
    partial = database.with_name(f".{database.name}.{os.getpid()}.partial")
    try:
        shutil.copyfile(template, partial)
        now = int(time.time() * 1000)
        with contextlib.closing(sqlite3.connect(partial)) as connection, connection:
            connection.execute(
                "UPDATE experiments SET artifact_location = ?, creation_time = ?, "
                "last_update_time = ? WHERE experiment_id = 0",
                (f"{artifact_root.rstrip('/')}/0" if artifact_root else None, now, now),
            )
        os.link(partial, database)  # fails if another process made the store meanwhile
    except FileExistsError:
        pass
    finally:
        partial.unlink(missing_ok=True)


def _empty_store() -> Path:
    """The empty store of this MLflow version in the user's cache, made by MLflow on first use
    (in a temporary file renamed into place: concurrent first uses each make a complete one)."""
    from importlib.metadata import version

    template = user_cache_dir() / f"mlflow-{version('mlflow')}-empty-store.db"
    if template.exists():
        return template
    template.parent.mkdir(parents=True, exist_ok=True)
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    with tempfile.TemporaryDirectory(dir=template.parent) as folder:
        made = Path(folder) / template.name
        store = SqlAlchemyStore(f"sqlite:///{made}", Path(folder, "artifacts").as_uri())
        store.engine.dispose()
        os.replace(made, template)
    return template


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
