"""The pipeline's MLflow run: one per pipeline run, re-attached on a retry, never duplicated.

Owns the parent run (experiment = pipeline name): tags (pipeline, TFX run id, MLMD execution ids,
git commit and dirty flag, package versions, device), params (the resolved config flattened, with
secrets masked), summary metrics (eval metrics, training throughput and input wait, rows per
split, anomalies per split), artifacts (schema, anomalies, TensorBoard logs, profiler trace,
last_run.json, the pushed model as an MLflow model with its signature), nested runs for
Transform and Evaluator (the Trainer's is made by its hook), and the model registry entry.

The run key: sha256 over the resolved config (without the `tracking` section), the input files'
content hashes and the code fingerprint of `trainer_module`/`serving`. A run with that key that
did not finish (RUNNING after a kill, FAILED after an error) is re-attached by the next
`fullthrottle run` with the same inputs; a FINISHED one is not (a new pipeline run gets a new
MLflow run). Refuses nothing: every tracking failure is recorded and reported, never raised.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.entities import Metric, Param, RunTag

from fullthrottle.core.config import Config
from fullthrottle.core.redact import redact, redact_text, redact_value
from fullthrottle.tracking.channel import Channel
from fullthrottle.tracking.hook import COMPONENT_TAG
from fullthrottle.tracking.store import (
    TRAINER_ENV,
    Destination,
    TrainerLink,
    bound_http_requests,
    prepare_store,
    resolve_destination,
)
from trainer_module.training import metrics as training_metrics
from trainer_module.training.results import derived_params

if TYPE_CHECKING:
    from fullthrottle.outcome import RunOutcome

RUN_KEY_TAG = "fullthrottle.run_key"
PIPELINE_TAG = "fullthrottle.pipeline_name"
TRAINER_STATUS_FILE = "trainer_tracking_status.json"
PACKAGES = (
    "tensorflow",
    "keras",
    "tfx",
    "apache-beam",
    "mlflow",
    "tensorflow-transform",
    "tensorflow-model-analysis",
)
_REPO = Path(__file__).resolve().parents[2]


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """{"training": {"seed": 42}} -> {"training.seed": "42"}; lists of mappings become JSON."""
    flat: dict[str, str] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(data, (list, tuple)):
        value = json.dumps(data, default=str, ensure_ascii=False)
    else:
        value = "None" if data is None else str(data)
    return {prefix: str(redact_value(prefix, value))[:6000]}


def config_params(config: Config) -> dict[str, str]:
    return flatten(redact(dataclasses.asdict(config)))


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_key(config: Config, *, source_files: tuple[str, ...], code_fingerprint: str) -> str:
    """The deterministic identity of a pipeline run (see the module docstring)."""
    described = dataclasses.asdict(config)
    described.pop("tracking", None)  # where and how we track does not change what is tracked
    files = []
    for name in sorted(source_files):
        path = Path(name)
        files.append([name, _file_digest(path) if path.is_file() else None])
    material = {
        "config": described,
        "output": str(config.output_path),
        "data": files,
        "code": code_fingerprint,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[
        :32
    ]


def git_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the repository holding this code, or (None, None) outside git."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(_REPO), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "-C", str(_REPO), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
        )
        return commit, dirty
    except (OSError, subprocess.SubprocessError):
        return None, None


def environment_tags() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    tags = {
        "fullthrottle.python": platform.python_version(),
        "fullthrottle.host_cpu": platform.machine(),
    }
    for package in PACKAGES:
        try:
            tags[f"fullthrottle.version.{package}"] = version(package)
        except PackageNotFoundError:
            continue
    commit, dirty = git_state()
    if commit:
        tags["mlflow.source.git.commit"] = commit
        tags["fullthrottle.git_dirty"] = str(dirty).lower()
    try:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        tags["fullthrottle.device"] = f"{len(gpus)} GPU" if gpus else f"CPU x{os.cpu_count()}"
    except Exception:  # noqa: BLE001 - a tag is not worth failing for
        pass
    return tags


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class PipelineTracker:
    """Start before the pipeline, `finish` after it; `status()` goes into last_run.json."""

    def __init__(self, config: Config, destination: Destination) -> None:
        self.config = config
        self.destination = destination
        self.channel = Channel(
            destination.uri,
            retries=config.tracking.retries,
            backoff_seconds=config.tracking.retry_backoff_seconds,
        )
        self.experiment_id: str | None = None
        self.run_id: str | None = None
        self.reattached = False
        self.registered_version: str | None = None
        self.trainer_status: dict[str, Any] | None = None

    @property
    def status_path(self) -> Path:
        return self.config.output_path / "mlflow" / TRAINER_STATUS_FILE

    # --- start --------------------------------------------------------------------------------
    def start(self, *, source_files: tuple[str, ...], code_fingerprint: str) -> None:
        client = self.channel.client
        fingerprint = code_fingerprint
        key = run_key(self.config, source_files=source_files, code_fingerprint=fingerprint)
        name = self.config.tracking.experiment or self.config.pipeline_name
        reached, experiment = self.channel.attempt(
            "find the experiment", client.get_experiment_by_name, name
        )
        if not reached:
            return
        if experiment is None:
            artifact_location = (
                f"{self.destination.artifact_root}/{name}"
                if self.destination.artifact_root
                else None
            )
            self.experiment_id = self.channel.call(
                "create the experiment",
                client.create_experiment,
                name,
                artifact_location=artifact_location,
            )
            if self.experiment_id is None:  # created concurrently by someone else?
                experiment = self.channel.call(
                    "find the experiment", client.get_experiment_by_name, name
                )
        if experiment is not None:
            self.experiment_id = experiment.experiment_id
        if self.experiment_id is None:
            return
        found = self.channel.call(
            "find a run to resume",
            client.search_runs,
            [self.experiment_id],
            filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'",
            max_results=50,
        )
        if found is None:
            return  # unreachable: a new run now could duplicate the one we could not see
        unfinished = [r for r in found if r.info.status != "FINISHED"]
        if unfinished:
            run = sorted(unfinished, key=lambda r: r.info.start_time)[-1]
            self.run_id, self.reattached = run.info.run_id, True
            attempts = int(run.data.tags.get("fullthrottle.attempts", "1")) + 1
            self.channel.ok("reopen the run", client.update_run, self.run_id, status="RUNNING")
            self.channel.ok(
                "count the attempt",
                client.set_tag,
                self.run_id,
                "fullthrottle.attempts",
                str(attempts),
            )
        else:
            stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
            run = self.channel.call(
                "create the pipeline run",
                client.create_run,
                self.experiment_id,
                run_name=f"{self.config.pipeline_name}-{stamp}",
                tags={
                    RUN_KEY_TAG: key,
                    PIPELINE_TAG: self.config.pipeline_name,
                    "fullthrottle.attempts": "1",
                },
            )
            if run is None:
                return
            self.run_id = run.info.run_id
        tags = environment_tags()
        tags["fullthrottle.code_fingerprint"] = fingerprint
        tags["fullthrottle.tracking_uri"] = redact_text(self.destination.uri)
        tags["fullthrottle.output_dir"] = str(self.config.output_path)
        params = [Param(k, v) for k, v in sorted(config_params(self.config).items())]
        for chunk in _chunks(params, 100):
            self.channel.ok("log the config as params", client.log_batch, self.run_id, params=chunk)
        self.channel.ok(
            "tag the run",
            client.log_batch,
            self.run_id,
            tags=[RunTag(k, redact_text(v)) for k, v in tags.items()],
        )

    @contextlib.contextmanager
    def trainer_environment(self) -> Iterator[None]:
        """Links the in-process Trainer to this run through `TRAINER_ENV` while the pipeline runs."""
        if self.run_id is None or self.experiment_id is None:
            yield
            return
        tracking = self.config.tracking
        link = TrainerLink(
            uri=self.destination.uri,
            experiment_id=self.experiment_id,
            parent_run_id=self.run_id,
            status_path=str(self.status_path),
            retries=tracking.retries,
            retry_backoff_seconds=tracking.retry_backoff_seconds,
            flush_timeout_seconds=tracking.flush_timeout_seconds,
            system_metrics_interval_seconds=tracking.system_metrics_interval_seconds,
            metrics_interval_seconds=tracking.metrics_interval_seconds,
            metrics_resolution_seconds=tracking.metrics_resolution_seconds,
        )
        with contextlib.suppress(FileNotFoundError):
            self.status_path.unlink()  # a stale status from an earlier run must not be read
        previous = os.environ.get(TRAINER_ENV)
        os.environ[TRAINER_ENV] = link.to_env()
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(TRAINER_ENV, None)
            else:
                os.environ[TRAINER_ENV] = previous

    # --- finish -------------------------------------------------------------------------------
    def finish(
        self, summary: dict[str, Any], outcome: RunOutcome | None, *, error: BaseException | None
    ) -> dict[str, Any]:
        """Logs the outcome, registers a pushed model, ends the run; returns `status()`."""
        if self.status_path.exists():
            with contextlib.suppress(OSError, json.JSONDecodeError):
                self.trainer_status = json.loads(self.status_path.read_text(encoding="utf-8"))
        if self.run_id is None:
            return self.status()
        components = outcome.components if outcome else {}
        self._log_outcome(summary, components)
        for component in ("Transform", "Trainer", "Evaluator"):
            if component in components:
                self._nested_run(component, components[component], summary)
        self._log_artifacts(summary, components)
        if summary.get("pushed_model_dir") and error is None:
            self._log_and_register_model(summary)
        client = self.channel.client
        if error is not None:
            self.channel.ok(
                "record the failure",
                client.set_tag,
                self.run_id,
                "fullthrottle.failure_reason",
                redact_text(str(summary.get("error", error)))[:5000],
            )
        self.channel.ok(
            "end the run",
            client.set_terminated,
            self.run_id,
            status="FAILED" if error is not None else "FINISHED",
        )
        return self.status()

    def status(self) -> dict[str, Any]:
        own = self.channel.status()
        trainer = self.trainer_status or {}
        failures = own["failures"] + [f"Trainer: {f}" for f in trainer.get("failures", [])]
        dropped = own["dropped_metric_points"] + int(trainer.get("dropped_metric_points", 0))
        complete = self.run_id is not None and not failures and not dropped
        return {
            "enabled": True,
            "complete": complete,
            "uri": redact_text(self.destination.uri),
            "experiment_id": self.experiment_id,
            "run_id": self.run_id,
            "trainer_run_id": trainer.get("trainer_run_id"),
            "reattached": self.reattached,
            "registered_model_version": self.registered_version,
            "failures": failures[:20],
            "dropped_metric_points": dropped,
        }

    def _log_outcome(self, summary: dict[str, Any], components: dict[str, Any]) -> None:
        client = self.channel.client
        tags = {
            "fullthrottle.tfx_run_id": str(summary.get("run_id")),
            "fullthrottle.status": str(summary.get("status")),
            "fullthrottle.blessed": str(bool(summary.get("blessed"))).lower(),
        }
        for name, comp in components.items():
            tags[f"fullthrottle.execution_id.{name}"] = str(comp.execution_id)
            tags[f"fullthrottle.state.{name}"] = comp.state
        training = summary.get("training") or {}
        step = int(training.get(training_metrics.STEPS_COMPLETED) or 0)
        now = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
        values: dict[str, float] = {
            f"eval.{k}": v for k, v in (summary.get("eval_metrics") or {}).items()
        }
        for key in training_metrics.SUMMARY_METRICS:
            if training.get(key) is not None:
                values[f"train.{key}"] = float(training[key])
        for key, value in (training.get("eval_metrics") or {}).items():
            values[f"train.{training_metrics.eval_metric_name(key)}"] = float(value)
        values.update(_split_counts(components))
        for name, comp in summary.get("components", {}).items():
            values[f"seconds.{name}"] = float(comp.get("seconds", 0.0))
        metrics = [Metric(k, float(v), now, step) for k, v in values.items()]
        # Derived training values; the Trainer's hook logs the same when it ran in this attempt,
        # and identical params may be logged twice.
        params = [
            Param(f"derived.{name}", str(redact_value(name, value)))
            for name, value in derived_params(training).items()
            if value is not None
        ]
        self.channel.ok(
            "log the run's outcome",
            client.log_batch,
            self.run_id,
            metrics=metrics,
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        if params:
            self.channel.ok("log derived params", client.log_batch, self.run_id, params=params)

    def _nested_run(self, component: str, comp: Any, summary: dict[str, Any]) -> None:
        client = self.channel.client
        query = f"tags.`mlflow.parentRunId` = '{self.run_id}' and tags.`{COMPONENT_TAG}` = '{component}'"
        found = self.channel.call(
            f"find the {component} run",
            client.search_runs,
            [self.experiment_id],
            filter_string=query,
        )
        if found is None:
            return
        if found:
            run_id = sorted(found, key=lambda r: r.info.start_time)[0].info.run_id
        else:
            run = self.channel.call(
                f"create the {component} run",
                client.create_run,
                self.experiment_id,
                run_name=component,
                tags={"mlflow.parentRunId": self.run_id, COMPONENT_TAG: component},
            )
            if run is None:
                return
            run_id = run.info.run_id
        now = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
        metrics = [Metric("seconds", float(comp.seconds), now, 0)]
        if component == "Evaluator":
            metrics += [
                Metric(k, float(v), now, 0) for k, v in (summary.get("eval_metrics") or {}).items()
            ]
        tags = [
            RunTag("fullthrottle.execution_id", str(comp.execution_id)),
            RunTag("fullthrottle.state", comp.state),
        ]
        for key, artifacts in comp.outputs.items():
            if artifacts:
                tags.append(RunTag(f"fullthrottle.output.{key}", redact_text(artifacts[0]["uri"])))
        self.channel.ok(
            f"log the {component} summary", client.log_batch, run_id, metrics=metrics, tags=tags
        )
        self.channel.ok(
            f"end the {component} run", client.set_terminated, run_id, status="FINISHED"
        )

    def _log_artifacts(self, summary: dict[str, Any], components: dict[str, Any]) -> None:
        client = self.channel.client

        def first_uri(component: str, key: str) -> str | None:
            comp = components.get(component)
            outputs = comp.outputs.get(key) if comp else None
            return outputs[0]["uri"] if outputs else None

        # SchemaGen, or whichever node imports a schema (its id depends on the pipeline variant).
        schema_nodes = [name for name in components if "Schema" in name]
        schema = next((uri for uri in (first_uri(n, "schema") for n in schema_nodes) if uri), None)
        if schema and os.path.isdir(schema):
            self.channel.ok("log the schema", client.log_artifacts, self.run_id, schema, "schema")
        anomalies = first_uri("ExampleValidator", "anomalies")
        if anomalies and os.path.isdir(anomalies):
            with tempfile.TemporaryDirectory(prefix="fullthrottle-anomalies-") as tmp:
                _anomalies_as_text(anomalies, Path(tmp))
                self.channel.ok(
                    "log the anomalies report", client.log_artifacts, self.run_id, tmp, "anomalies"
                )
        model_run = first_uri("Trainer", "model_run")
        if model_run:
            for folder, artifact_path in (("logs", "tensorboard"), ("profile", "profile")):
                source = os.path.join(model_run, folder)
                if os.path.isdir(source):
                    self.channel.ok(
                        f"log {artifact_path}",
                        client.log_artifacts,
                        self.run_id,
                        source,
                        artifact_path,
                    )
        public = {**summary, "tracking": self.status()}
        self.channel.ok(
            "log last_run.json",
            client.log_dict,
            self.run_id,
            redact(public),
            "last_run.json",
        )

    def _log_and_register_model(self, summary: dict[str, Any]) -> None:
        from fullthrottle.tracking.mlflow_model import save_pyfunc

        client = self.channel.client
        pushed_dir = str(summary["pushed_model_dir"])
        with tempfile.TemporaryDirectory(prefix="fullthrottle-mlflow-model-") as tmp:
            target = Path(tmp) / "model"
            try:
                save_pyfunc(pushed_dir, target)
            except Exception as exc:  # noqa: BLE001 - the model is pushed; tracking it may fail
                self.channel.record_failure(f"describe the pushed model as an MLflow model: {exc}")
                return
            if not self.channel.ok(
                "log the pushed model", client.log_artifacts, self.run_id, str(target), "model"
            ):
                return
        if not self.config.tracking.register_model:
            return
        name = self.config.model_name
        push_version = str(summary.get("pushed_version"))
        existing = self.channel.call(
            "look up model versions",
            client.search_model_versions,
            f"name = '{name}' and run_id = '{self.run_id}'",
        )
        if existing is None:
            return
        same_push = [v for v in existing if v.tags.get("push_version") == push_version]
        if same_push:  # a retried run that got this far before: never register twice
            version = same_push[0]
        else:
            registered = self.channel.call(
                "find the registered model", _get_registered_model, client, name
            )
            if registered is None:
                return
            if registered is False:
                self.channel.call(
                    "create the registered model", client.create_registered_model, name
                )
            run = self.channel.call("read the run", client.get_run, self.run_id)
            if run is None:
                return
            version = self.channel.call(
                "register the model version",
                client.create_model_version,
                name,
                source=f"{run.info.artifact_uri}/model",
                run_id=self.run_id,
                tags={"serving_path": pushed_dir, "push_version": push_version},
                description=f"Pushed to {pushed_dir} (version folder {push_version}) by pipeline run {summary.get('run_id')}",
            )
            if version is None:
                return
        self.registered_version = str(version.version)
        self._move_alias(name, version)

    def _move_alias(self, name: str, version: Any) -> None:
        """The alias goes to this version unless the current holder was pushed later."""
        client = self.channel.client
        alias = self.config.tracking.registry_alias
        current = self.channel.call("read the alias", _alias_holder, client, name, alias)
        if current is not None and current is not False:
            try:
                if int(current.tags.get("push_version", "0")) > int(
                    version.tags.get("push_version", "0")
                ):
                    return
            except ValueError:
                pass
        self.channel.ok(
            "move the alias", client.set_registered_model_alias, name, alias, str(version.version)
        )


def _get_registered_model(client: Any, name: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False  # "no such model" is an answer, not a failure
        raise


def _alias_holder(client: Any, name: str, alias: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return False
        raise


def _split_counts(components: dict[str, Any]) -> dict[str, float]:
    """rows.<split> from StatisticsGen, anomalies.<split> from ExampleValidator."""
    from tensorflow_metadata.proto.v0 import anomalies_pb2, statistics_pb2

    counts: dict[str, float] = {}
    stats = components.get("StatisticsGen")
    for artifact in (stats.outputs.get("statistics", []) if stats else [])[:1]:
        for split_dir in sorted(Path(artifact["uri"]).glob("Split-*")):
            path = split_dir / "FeatureStats.pb"
            if path.exists():
                proto = statistics_pb2.DatasetFeatureStatisticsList.FromString(path.read_bytes())
                counts[f"rows.{split_dir.name[6:]}"] = float(
                    sum(d.num_examples for d in proto.datasets)
                )
    validator = components.get("ExampleValidator")
    for artifact in (validator.outputs.get("anomalies", []) if validator else [])[:1]:
        for split_dir in sorted(Path(artifact["uri"]).glob("Split-*")):
            path = split_dir / "SchemaDiff.pb"
            if path.exists():
                proto = anomalies_pb2.Anomalies.FromString(path.read_bytes())
                counts[f"anomalies.{split_dir.name[6:]}"] = float(
                    len(proto.anomaly_info) + (1 if proto.HasField("dataset_anomaly_info") else 0)
                )
    return counts


def _anomalies_as_text(anomalies_dir: str, target: Path) -> None:
    """Each split's anomalies as readable text (the binary protos are useless in a browser)."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import anomalies_pb2

    for split_dir in sorted(Path(anomalies_dir).glob("Split-*")):
        path = split_dir / "SchemaDiff.pb"
        if path.exists():
            proto = anomalies_pb2.Anomalies.FromString(path.read_bytes())
            (target / f"{split_dir.name}.pbtxt").write_text(
                text_format.MessageToString(proto), encoding="utf-8"
            )


def start_tracking(
    config: Config, *, source_files: tuple[str, ...], code_fingerprint: str
) -> PipelineTracker | None:
    """The pipeline's tracker, started; None when `tracking.enabled` is false.

    `code_fingerprint` identifies the code the pipeline runs (part of the run key)."""
    if not config.tracking.enabled:
        return None
    destination = resolve_destination(config)
    bound_http_requests(config)
    prepare_store(destination)
    tracker = PipelineTracker(config, destination)
    tracker.start(source_files=source_files, code_fingerprint=code_fingerprint)
    return tracker
