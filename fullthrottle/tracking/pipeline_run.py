"""The pipeline's MLflow run: one per pipeline run, re-attached on a retry, never duplicated.

Owns the parent run (experiment = pipeline name): tags (MLflow's source tags and git state, the
pipeline, its key for the Trainer, the TFX run id, MLMD execution ids, package versions,
device, why the model was or was not blessed), params (the resolved config flattened, with
secrets masked, without the `kubeflow` section, which a local run does not use, and without
unset fields), the training and eval data as MLflow datasets, summary metrics (``evaluator/*``
for the new model, ``baseline/*`` for the latest blessed model it was compared with,
``train/*``, ``eval/*``, ``rows/*``, ``anomalies/*``, ``seconds/*``), artifacts (schema,
statistics and anomalies as TFDV's HTML, the anomalies as text, TensorBoard logs, profiler
trace, last_run.json), the pushed model as an MLflow 3 logged model (`mlflow_model.py`) and its
registry entry (the alias moves only to a blessed, pushed model), and nested runs for Transform
and Evaluator (the Trainer's is made by its hook, linked through `trainer_link`).

The run key: sha256 over the resolved config (without the `tracking` section), the input files'
content hashes and the code fingerprint of `trainer_module`/`serving`. A run with that key that
did not finish (RUNNING after a kill, FAILED after an error) is re-attached by the next
`fullthrottle run` with the same inputs; a FINISHED one is not (a new pipeline run gets a new
MLflow run). Refuses nothing: every tracking failure is recorded and reported, never raised.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.entities import LoggedModelStatus, Metric, Param, RunTag

from fullthrottle.core.config import Config
from fullthrottle.core.redact import redact, redact_text, redact_value
from fullthrottle.tracking.channel import Channel
from fullthrottle.tracking.names import (
    ANOMALIES_GROUP,
    ATTACHED_AT_TAG,
    BASELINE_GROUP,
    BASELINE_MODEL_TAG,
    BASELINE_VERSION_TAG,
    BLESSING_REASON_TAG,
    COMPONENT_TAG,
    EVALUATOR_GROUP,
    INTERRUPTED_BY_TAG,
    PIPELINE_KEY_TAG,
    PIPELINE_TAG,
    PUSH_VERSION_TAG,
    ROWS_GROUP,
    RUN_KEY_TAG,
    SECONDS_GROUP,
    flatten,
    metric_name,
)
from fullthrottle.tracking.sources import environment_tags, source_tags
from fullthrottle.tracking.store import (
    Destination,
    TrainerLink,
    bound_http_requests,
    prepare_store,
    resolve_destination,
    scoped_tracking_uri,
    trainer_link,
)
from trainer_module.training import metrics as training_metrics
from trainer_module.training.results import derived_params

if TYPE_CHECKING:
    from fullthrottle.outcome import RunOutcome

# Config sections that are not parameters of a local run: `kubeflow` only shapes
# `fullthrottle compile`.
NOT_RUN_PARAMS = ("kubeflow",)
# The two datasets of a run: ExampleGen's splits, with MLflow's context names.
DATASETS = (("train", "training"), ("eval", "evaluation"))
EXAMPLES_FOR_THE_MODEL = 16  # evaluation rows read for the logged model's input example


def config_params(config: Config) -> dict[str, str]:
    """The config as a run's params: flattened, secrets masked, unset fields and the sections a
    local run does not use left out."""
    described = {k: v for k, v in dataclasses.asdict(config).items() if k not in NOT_RUN_PARAMS}
    return flatten(redact(described))


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def input_digest(source_files: tuple[str, ...]) -> list[list[Any]]:
    """[file name, sha256 of its content] per input file, in name order (None: not a file)."""
    found = []
    for name in sorted(source_files):
        path = Path(name)
        found.append([name, _file_digest(path) if path.is_file() else None])
    return found


def run_key(config: Config, *, source_files: tuple[str, ...], code_fingerprint: str) -> str:
    """The deterministic identity of a pipeline run (see the module docstring)."""
    described = dataclasses.asdict(config)
    described.pop("tracking", None)  # where and how we track does not change what is tracked
    material = {
        "config": described,
        "output": str(config.output_path),
        "data": input_digest(source_files),
        "code": code_fingerprint,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[
        :32
    ]


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _now_ms() -> int:
    return int(dt.datetime.now(dt.UTC).timestamp() * 1000)


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
        self.model_id: str | None = None
        self.trainer_status: dict[str, Any] | None = None
        self.data_digest: list[list[Any]] = []

    @property
    def experiment_name(self) -> str:
        return self.config.tracking.experiment or self.config.pipeline_name

    def trainer_link(self) -> TrainerLink:
        """The Trainer's link to this run (it goes into the Trainer's custom_config): the same on
        every run of this pipeline with these tracking settings, so the Trainer's cache key does
        not change from run to run; the Trainer finds this run by its pipeline key tag."""
        return trainer_link(
            self.config,
            self.destination,
            pipeline_root=str(self.config.pipeline_root),
            experiment=self.experiment_name,
        )

    # --- start --------------------------------------------------------------------------------
    def start(self, *, source_files: tuple[str, ...], code_fingerprint: str) -> None:
        client = self.channel.client
        fingerprint = code_fingerprint
        self.data_digest = input_digest(source_files)
        key = run_key(self.config, source_files=source_files, code_fingerprint=fingerprint)
        name = self.experiment_name
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
        link = self.trainer_link()
        unfinished = [r for r in found if r.info.status != "FINISHED"]
        if unfinished:
            run = sorted(unfinished, key=lambda r: r.info.start_time)[-1]
            self.run_id, self.reattached = run.info.run_id, True
            attempts = int(run.data.tags.get("fullthrottle.attempts", "1")) + 1
            self.channel.ok("reopen the run", client.update_run, self.run_id, status="RUNNING")
            self.channel.ok(
                "count the attempt",
                client.log_batch,
                self.run_id,
                tags=[
                    RunTag("fullthrottle.attempts", str(attempts)),
                    # The newest attached parent is the one the Trainer joins.
                    RunTag(ATTACHED_AT_TAG, str(_now_ms())),
                ],
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
                    PIPELINE_KEY_TAG: str(link.pipeline_key),
                    ATTACHED_AT_TAG: str(_now_ms()),
                    "fullthrottle.attempts": "1",
                },
            )
            if run is None:
                return
            self.run_id = run.info.run_id
        tags = {**source_tags(), **environment_tags()}
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

    # --- finish -------------------------------------------------------------------------------
    def finish(
        self, summary: dict[str, Any], outcome: RunOutcome | None, *, error: BaseException | None
    ) -> dict[str, Any]:
        """Logs the outcome, registers a pushed model, ends the run; returns `status()`."""
        components = outcome.components if outcome else {}
        trainer = components.get("Trainer")
        # The Trainer's own tracking status is in its run summary, when it ran in this run (a
        # cached Trainer's summary speaks of an earlier run).
        if trainer is not None and trainer.state == "complete":
            self.trainer_status = (summary.get("training") or {}).get("tracking")
        if self.run_id is None:
            return self.status()
        self._log_outcome(summary, components)
        for component in ("Transform", "Trainer", "Evaluator"):
            if component in components:
                self._nested_run(component, components[component], summary)
        self._log_datasets(components)
        self._log_artifacts(summary, components)
        # Only a model the Evaluator blessed is pushed, registered and given the alias.
        if summary.get("blessed") and summary.get("pushed_model_dir") and error is None:
            self._log_and_register_model(summary, components)
        client = self.channel.client
        if error is not None and not summary.get("interrupted"):
            self.channel.ok(
                "record the failure",
                client.set_tag,
                self.run_id,
                "fullthrottle.failure_reason",
                redact_text(str(summary.get("error", error)))[:5000],
            )
        status = "FAILED" if error is not None else "FINISHED"
        interrupted = summary.get("interrupted")
        if interrupted:  # a signal: KILLED, which the rerun re-attaches as after a crash
            status = "KILLED"
            self.channel.ok(
                "record the interruption",
                client.set_tag,
                self.run_id,
                INTERRUPTED_BY_TAG,
                str(interrupted.get("signal")),
            )
        self.channel.ok("end the run", client.set_terminated, self.run_id, status=status)
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
            "model_id": self.model_id,
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
            **_evaluation_tags(summary),
        }
        for name, comp in components.items():
            tags[f"fullthrottle.execution_id.{name}"] = str(comp.execution_id)
            tags[f"fullthrottle.state.{name}"] = comp.state
        training = summary.get("training") or {}
        step = int(training.get(training_metrics.STEPS_COMPLETED) or 0)
        now = _now_ms()
        values = _evaluation_metrics(summary)
        for key in training_metrics.SUMMARY_METRICS:
            if training.get(key) is not None:
                values[training_metrics.chart_name(key)] = float(training[key])
        for key, value in (training.get("eval_metrics") or {}).items():
            values[training_metrics.eval_chart_name(key)] = float(value)
        values.update(_split_counts(components))
        for name, comp in summary.get("components", {}).items():
            values[metric_name(SECONDS_GROUP, name)] = float(comp.get("seconds", 0.0))
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
        now = _now_ms()
        metrics = [Metric(metric_name(SECONDS_GROUP, component), float(comp.seconds), now, 0)]
        tags = [
            RunTag("fullthrottle.execution_id", str(comp.execution_id)),
            RunTag("fullthrottle.state", comp.state),
        ]
        if component == "Evaluator":
            metrics += [Metric(k, v, now, 0) for k, v in _evaluation_metrics(summary).items()]
            tags += [RunTag(k, v) for k, v in _evaluation_tags(summary).items()]
        for key, artifacts in comp.outputs.items():
            if artifacts:
                tags.append(RunTag(f"fullthrottle.output.{key}", redact_text(artifacts[0]["uri"])))
        self.channel.ok(
            f"log the {component} summary", client.log_batch, run_id, metrics=metrics, tags=tags
        )
        # A component that did not complete ends as the run did: KILLED when a signal stopped
        # it (the rerun re-attaches its run), FAILED otherwise.
        if comp.state in ("complete", "cached"):
            status = "FINISHED"
        else:
            status = "KILLED" if summary.get("interrupted") else "FAILED"
        self.channel.ok(f"end the {component} run", client.set_terminated, run_id, status=status)

    def _log_datasets(self, components: dict[str, Any]) -> None:
        """ExampleGen's train and eval splits as MLflow datasets of the run (`log_inputs`)."""
        examples = _first_output(components, "ExampleGen", "examples")
        if examples is None:
            return
        try:
            inputs = _dataset_inputs(
                examples,
                schema=_schema_of(components),
                rows=_split_counts(components),
                data_digest=self.data_digest,
                split_config=(self.config.data.train_buckets, self.config.data.eval_buckets),
            )
        except Exception as exc:  # noqa: BLE001 - describing the data may fail; the run does not
            self.channel.record_failure(f"describe the datasets: {type(exc).__name__}: {exc}")
            return
        if inputs:
            self.channel.ok(
                "log the datasets", self.channel.client.log_inputs, self.run_id, datasets=inputs
            )

    def _log_artifacts(self, summary: dict[str, Any], components: dict[str, Any]) -> None:
        client = self.channel.client

        def first_uri(component: str, key: str) -> str | None:
            comp = components.get(component)
            outputs = comp.outputs.get(key) if comp else None
            return outputs[0]["uri"] if outputs else None

        schema = _schema_uri(components)
        if schema and os.path.isdir(schema):
            self.channel.ok("log the schema", client.log_artifacts, self.run_id, schema, "schema")
        statistics = first_uri("StatisticsGen", "statistics")
        anomalies = first_uri("ExampleValidator", "anomalies")
        with tempfile.TemporaryDirectory(prefix="fullthrottle-data-report-") as tmp:
            reports = Path(tmp)
            try:
                written = _data_reports(statistics, anomalies, schema, reports)
            except Exception as exc:  # noqa: BLE001 - the reports are for people; the run goes on
                self.channel.record_failure(f"render the data reports: {type(exc).__name__}: {exc}")
                written = False
            if written:
                self.channel.ok(
                    "log the data reports", client.log_artifacts, self.run_id, tmp, "data"
                )
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

    def _log_and_register_model(self, summary: dict[str, Any], components: dict[str, Any]) -> None:
        """The pushed model as the run's MLflow logged model, registered from it; once per push
        even when the run is retried (found again by its push version)."""
        client = self.channel.client
        pushed_dir = str(summary["pushed_model_dir"])
        push_version = str(summary.get("pushed_version"))
        found = self.channel.call(
            "look up logged models",
            client.search_logged_models,
            [self.experiment_id],
            filter_string=(
                f"source_run_id = '{self.run_id}' AND tags.`{PUSH_VERSION_TAG}` = '{push_version}'"
            ),
        )
        if found is None:
            return
        ready = [m for m in found if m.status == LoggedModelStatus.READY]
        if ready:
            model_id = ready[0].model_id
        else:
            # A Pusher stopped while it logged leaves its logged model PENDING: this attempt
            # logs into that one, so that the run has one model output per push.
            interrupted = found[0].model_id if found else None
            linked = False
            if interrupted:
                run = self.channel.call("read the run's outputs", client.get_run, self.run_id)
                if run is None:
                    return
                outputs = run.outputs.model_outputs if run.outputs else []
                linked = interrupted in {o.model_id for o in outputs}
            model_id = self._log_model(
                pushed_dir, push_version, components, model_id=interrupted, linked=linked
            )
            if model_id is None:
                return
        self.model_id = model_id
        self._log_model_results(model_id, summary)
        if not self.config.tracking.register_model:
            return
        name = self.config.model_name
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
            with scoped_tracking_uri(self.destination.uri):
                version = self.channel.call(
                    "register the model version",
                    client.create_model_version,
                    name,
                    source=f"models:/{model_id}",
                    run_id=self.run_id,
                    model_id=model_id,
                    tags={
                        "serving_path": pushed_dir,
                        "push_version": push_version,
                        **_evaluation_tags(summary),
                    },
                    description=f"Pushed to {pushed_dir} (version folder {push_version}) by pipeline run {summary.get('run_id')}",
                )
            if version is None:
                return
        self.registered_version = str(version.version)
        self._move_alias(name, version)

    def _log_model_results(self, model_id: str, summary: dict[str, Any]) -> None:
        """The Evaluator's metrics and the run's params on the logged model itself, so MLflow 3's
        model page shows what the model scored (on the eval split's dataset) and how it was made.
        Metrics carry the model's id (and the eval dataset's name and digest) and are logged in
        the run; params with `log_model_params`. Logging them again on a retried run is harmless:
        the same values."""
        client = self.channel.client
        now = _now_ms()
        eval_dataset = {"dataset_name": "eval", "dataset_digest": self._eval_dataset_digest()}
        metrics = [
            Metric(
                metric_name(EVALUATOR_GROUP, key),
                float(value),
                now,
                0,
                model_id=model_id,
                **(eval_dataset if eval_dataset["dataset_digest"] else {}),
            )
            for key, value in (summary.get("eval_metrics") or {}).items()
        ]
        if metrics:
            self.channel.ok(
                "log the Evaluator's metrics on the model",
                client.log_batch,
                self.run_id,
                metrics=metrics,
            )
        params = config_params(self.config)
        if params:
            self.channel.ok(
                "log the params on the model", client.log_model_params, model_id, params
            )

    def _eval_dataset_digest(self) -> str | None:
        """The digest `_log_datasets` gives the eval split (None when the data is unknown)."""
        if not self.data_digest:
            return None
        return dataset_digest(
            self.data_digest,
            "eval",
            (self.config.data.train_buckets, self.config.data.eval_buckets),
        )

    def _log_model(
        self,
        pushed_dir: str,
        push_version: str,
        components: dict[str, Any],
        *,
        model_id: str | None,
        linked: bool,
    ) -> str | None:
        from fullthrottle.tracking.mlflow_model import log_served_model

        examples = _first_output(components, "ExampleGen", "examples")
        try:
            records = _eval_records(examples, limit=EXAMPLES_FOR_THE_MODEL) if examples else []
            # One attempt: a retry after a partial failure could leave a second logged model.
            info = log_served_model(
                uri=self.destination.uri,
                experiment_id=str(self.experiment_id),
                run_id=str(self.run_id),
                saved_model_dir=pushed_dir,
                examples=records,
                tags={PUSH_VERSION_TAG: push_version},
                model_id=model_id,
                link_to_run=not linked,
            )
        except Exception as exc:  # noqa: BLE001 - the model is pushed; tracking it may fail
            self.channel.record_failure(
                f"log the pushed model as an MLflow model: {type(exc).__name__}: {exc}"
            )
            return None
        return info.model_id

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


def _evaluation_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The new model's evaluation metrics (``evaluator/*``) and those of the latest blessed
    model it was compared with (``baseline/*``)."""
    values = {
        metric_name(EVALUATOR_GROUP, k): float(v)
        for k, v in (summary.get("eval_metrics") or {}).items()
    }
    baseline = (summary.get("evaluation") or {}).get("baseline") or {}
    for key, value in (baseline.get("metrics") or {}).items():
        values[metric_name(BASELINE_GROUP, key)] = float(value)
    return values


def _evaluation_tags(summary: dict[str, Any]) -> dict[str, str]:
    """Why the new model was or was not blessed, and the baseline it was compared with."""
    evaluation = summary.get("evaluation") or {}
    tags: dict[str, str] = {}
    if evaluation.get("reason"):
        verdict = "blessed" if evaluation.get("blessed") else "not blessed"
        tags[BLESSING_REASON_TAG] = f"{verdict}: {evaluation['reason']}"[:5000]
    baseline = evaluation.get("baseline") or {}
    if baseline.get("model_uri"):
        tags[BASELINE_MODEL_TAG] = redact_text(str(baseline["model_uri"]))
    if baseline.get("pushed_version"):
        tags[BASELINE_VERSION_TAG] = str(baseline["pushed_version"])
    return tags


def _first_output(components: dict[str, Any], suffix: str, key: str) -> dict[str, Any] | None:
    """The first `key` output of the component whose name ends with `suffix` (CsvExampleGen,
    ImportExampleGen), or None."""
    for name, comp in components.items():
        if name.endswith(suffix) and comp.outputs.get(key):
            return comp.outputs[key][0]
    return None


def _schema_uri(components: dict[str, Any]) -> str | None:
    # SchemaGen, or whichever node imports a schema (its id depends on the pipeline variant).
    for name, comp in components.items():
        if "Schema" in name and comp.outputs.get("schema"):
            return comp.outputs["schema"][0]["uri"]
    return None


def _schema_of(components: dict[str, Any]) -> Any:
    """The pipeline's schema (tensorflow_metadata Schema) or None."""
    return _schema_from(_schema_uri(components))


def _dataset_inputs(
    examples: dict[str, Any],
    *,
    schema: Any,
    rows: dict[str, float],
    data_digest: list[list[Any]],
    split_config: tuple[int, int],
) -> list[Any]:
    """MLflow `DatasetInput`s for ExampleGen's train and eval splits.

    Source: the split's folder. Digest: of what decides the split's content, the input files'
    content hashes, the split name and the train : eval shares, so equal data gives equal digests
    across runs and output folders without reading the examples again. Schema: the pipeline's
    (the columns with their types). Profile: the number of rows (StatisticsGen).
    """
    from mlflow.data.dataset_source_registry import get_dataset_source_from_json
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.types import ColSpec, DataType, Schema
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT
    from tensorflow_metadata.proto.v0 import schema_pb2

    kinds = {
        schema_pb2.INT: DataType.long,
        schema_pb2.FLOAT: DataType.double,
        schema_pb2.BYTES: DataType.string,
    }
    columns = (
        Schema([ColSpec(kinds.get(f.type, DataType.string), f.name) for f in schema.feature])
        if schema is not None and len(schema.feature)
        else None
    )
    splits = json.loads(examples["properties"].get("split_names") or "[]")
    found = []
    for split, context in DATASETS:
        if split not in splits:
            continue
        uri = os.path.join(examples["uri"], f"Split-{split}")
        dataset = MetaDataset(
            source=get_dataset_source_from_json(json.dumps({"uri": uri}), source_type="local"),
            name=split,
            digest=dataset_digest(data_digest, split, split_config),
            schema=columns,
        )
        profile = (
            {"num_rows": int(rows[f"{ROWS_GROUP}/{split}"])}
            if f"{ROWS_GROUP}/{split}" in rows
            else None
        )
        entity = Dataset(**dataset.to_dict(), profile=json.dumps(profile) if profile else None)
        found.append(DatasetInput(entity, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)]))
    return found


def dataset_digest(
    data_digest: list[list[Any]], split: str, split_config: tuple[int, int] | list[int]
) -> str:
    """A split's dataset digest: of the input files' content hashes, the split's name and the
    train : eval shares (what decides the split's content)."""
    material = json.dumps([data_digest, split, list(split_config)], sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def _eval_records(examples: dict[str, Any], *, limit: int) -> list[bytes]:
    """The first `limit` serialized tf.Examples of ExampleGen's eval split."""
    import tensorflow as tf

    files = sorted(tf.io.gfile.glob(os.path.join(examples["uri"], "Split-eval", "*")))
    dataset = tf.data.TFRecordDataset(files, compression_type="GZIP").take(limit)
    return [record.numpy() for record in dataset]


def _data_reports(
    statistics: str | None, anomalies: str | None, schema: str | None, target: Path
) -> bool:
    """TFDV's HTML views: statistics.html (train against eval, Facets Overview),
    anomalies.html (a table per split) and schema.html. Returns whether anything was written."""
    from tensorflow_data_validation.utils import display_util
    from tensorflow_metadata.proto.v0 import anomalies_pb2, statistics_pb2

    written = False
    if statistics and os.path.isdir(statistics):
        splits = {
            d.name[len("Split-") :]: statistics_pb2.DatasetFeatureStatisticsList.FromString(
                (d / "FeatureStats.pb").read_bytes()
            )
            for d in sorted(Path(statistics).glob("Split-*"))
            if (d / "FeatureStats.pb").exists()
        }
        if splits:
            names = [n for n in ("train", "eval") if n in splits] or sorted(splits)
            html = display_util.get_statistics_html(
                lhs_statistics=splits[names[0]],
                rhs_statistics=splits[names[1]] if len(names) > 1 else None,
                lhs_name=names[0],
                rhs_name=names[1] if len(names) > 1 else "rhs_statistics",
            )
            (target / "statistics.html").write_text(_page("Statistics", html), encoding="utf-8")
            written = True
    if anomalies and os.path.isdir(anomalies):
        sections = []
        for split_dir in sorted(Path(anomalies).glob("Split-*")):
            path = split_dir / "SchemaDiff.pb"
            if path.exists():
                frame = display_util.get_anomalies_dataframe(
                    anomalies_pb2.Anomalies.FromString(path.read_bytes())
                )
                table = frame.to_html() if len(frame) else "<p>No anomalies.</p>"
                sections.append(f"<h2>{split_dir.name[len('Split-') :]}</h2>{table}")
        if sections:
            (target / "anomalies.html").write_text(
                _page("Anomalies", "".join(sections)), encoding="utf-8"
            )
            written = True
    parsed = _schema_from(schema)
    if parsed is not None:
        features, domains = display_util.get_schema_dataframe(parsed)
        body = features.to_html() + (f"<h2>Domains</h2>{domains.to_html()}" if len(domains) else "")
        (target / "schema.html").write_text(_page("Schema", body), encoding="utf-8")
        written = True
    return written


def _schema_from(uri: str | None) -> Any:
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    path = Path(uri, "schema.pbtxt") if uri else None
    if path is None or not path.is_file():
        return None
    return text_format.Parse(path.read_text(encoding="utf-8"), schema_pb2.Schema())


def _page(title: str, body: str) -> str:
    return f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head><body><h1>{title}</h1>{body}</body></html>"


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
    """rows/<split> from StatisticsGen, anomalies/<split> from ExampleValidator."""
    from tensorflow_metadata.proto.v0 import anomalies_pb2, statistics_pb2

    counts: dict[str, float] = {}
    stats = components.get("StatisticsGen")
    for artifact in (stats.outputs.get("statistics", []) if stats else [])[:1]:
        for split_dir in sorted(Path(artifact["uri"]).glob("Split-*")):
            path = split_dir / "FeatureStats.pb"
            if path.exists():
                proto = statistics_pb2.DatasetFeatureStatisticsList.FromString(path.read_bytes())
                counts[metric_name(ROWS_GROUP, split_dir.name[6:])] = float(
                    sum(d.num_examples for d in proto.datasets)
                )
    validator = components.get("ExampleValidator")
    for artifact in (validator.outputs.get("anomalies", []) if validator else [])[:1]:
        for split_dir in sorted(Path(artifact["uri"]).glob("Split-*")):
            path = split_dir / "SchemaDiff.pb"
            if path.exists():
                proto = anomalies_pb2.Anomalies.FromString(path.read_bytes())
                counts[metric_name(ANOMALIES_GROUP, split_dir.name[6:])] = float(
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
    bound_http_requests(config.tracking.request_timeout_seconds)
    prepare_store(destination)
    tracker = PipelineTracker(config, destination)
    tracker.start(source_files=source_files, code_fingerprint=code_fingerprint)
    return tracker
