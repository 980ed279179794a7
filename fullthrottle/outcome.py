"""What a pipeline run did, read back from ML Metadata (the record TFX itself keeps).

`read_latest_run` reads the newest run of a pipeline: each component's state and duration,
whether the model was blessed and pushed and where, the evaluation (the new model's metrics, the
latest blessed model's it was compared with, the thresholds it failed) and the trainer's
summary. The pieces it is made of (`open_store`, `latest_run`, `run_executions`) are what the
progress lines read too, through ML Metadata's own API, never its SQL tables.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from trainer_module.training.results import SUMMARY_FILE

# ML Metadata's execution states, as shown to people.
EXECUTION_STATES = {
    metadata_store_pb2.Execution.UNKNOWN: "unknown",
    metadata_store_pb2.Execution.NEW: "new",
    metadata_store_pb2.Execution.RUNNING: "running",
    metadata_store_pb2.Execution.COMPLETE: "complete",
    metadata_store_pb2.Execution.FAILED: "failed",
    metadata_store_pb2.Execution.CACHED: "cached",
    metadata_store_pb2.Execution.CANCELED: "canceled",
}
RUN_CONTEXT = "pipeline_run"  # TFX's context type of one pipeline run
NODE_CONTEXT = "node"  # TFX's context type of one component, named "<pipeline>.<component>"


@dataclass
class ComponentOutcome:
    component: str
    state: str
    seconds: float
    execution_id: int
    outputs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass
class ModelEvaluation:
    """One model's side of an evaluation: its Trainer artifact and its metrics (overall slice).
    `pushed_version`: the version folder a Pusher published it as, when one did."""

    model_uri: str | None
    model_id: int | None
    metrics: dict[str, float]
    pushed_version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_uri": self.model_uri,
            "model_id": self.model_id,
            "pushed_version": self.pushed_version,
            "metrics": self.metrics,
        }


@dataclass
class Evaluation:
    """What the Evaluator found: the candidate's metrics, the baseline's (the latest blessed model
    of the pipeline, when there was one), and the thresholds the candidate failed, as TFMA's
    validation result lists them: ("bound" | "baseline", metric name)."""

    candidate: ModelEvaluation
    baseline: ModelEvaluation | None
    failures: tuple[tuple[str, str], ...]

    def missed(self, kind: str, metric: str) -> bool:
        return (kind, metric) in self.failures


@dataclass
class RunOutcome:
    run_id: str
    components: dict[str, ComponentOutcome]
    blessed: bool
    pushed_model_dir: str | None
    pushed_version: str | None
    eval_metrics: dict[str, float]
    training_summary: dict[str, Any] | None
    evaluation: Evaluation | None = None


def open_store(mlmd_path: str, *, read_only: bool = False) -> metadata_store.MetadataStore:
    """The ML Metadata store in the SQLite file `mlmd_path` (`read_only`: opened read-only)."""
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = mlmd_path
    config.sqlite.connection_mode = (
        metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
        if read_only
        else metadata_store_pb2.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
    )
    return metadata_store.MetadataStore(config)


def latest_run(
    store: metadata_store.MetadataStore, *, since_ms: int = 0
) -> metadata_store_pb2.Context | None:
    """The newest pipeline run created at or after `since_ms` (epoch milliseconds), or None."""
    runs = [
        r for r in store.get_contexts_by_type(RUN_CONTEXT) if r.create_time_since_epoch >= since_ms
    ]
    return max(runs, key=lambda c: (c.create_time_since_epoch, c.id)) if runs else None


@dataclass(frozen=True)
class RunExecution:
    """One component's execution in a run: the node's name, its MLMD execution."""

    component: str
    execution: metadata_store_pb2.Execution

    @property
    def state(self) -> str:
        return EXECUTION_STATES.get(self.execution.last_known_state, "unknown")

    @property
    def seconds(self) -> float:
        started = self.execution.create_time_since_epoch
        ended = self.execution.last_update_time_since_epoch or started
        return max(0.0, (ended - started) / 1000.0)


def run_executions(
    store: metadata_store.MetadataStore, run: metadata_store_pb2.Context
) -> list[RunExecution]:
    """The executions of `run` in the order they were created, each named by its component."""
    found = []
    for execution in sorted(store.get_executions_by_context(run.id), key=lambda e: e.id):
        node = next(
            (
                c.name.split(".", 1)[-1]  # "<pipeline>.<Component>"
                for c in store.get_contexts_by_execution(execution.id)
                if c.type == NODE_CONTEXT
            ),
            str(execution.type_id),
        )
        found.append(RunExecution(component=node, execution=execution))
    return found


def _prop(artifact: Any, name: str) -> Any:
    for props in (artifact.custom_properties, artifact.properties):
        if name in props:
            value = props[name]
            kind = value.WhichOneof("value")
            return getattr(value, kind) if kind else None
    return None


def _read_evaluation(uri: str) -> tuple[dict[str, dict[str, float]], tuple[tuple[str, str], ...]]:
    """Metrics of the overall slice per model ("candidate", "baseline"; "" when the Evaluator
    had one model) and the failed thresholds, from the Evaluator's output folder."""
    import tensorflow_model_analysis as tfma

    per_model: dict[str, dict[str, float]] = {}
    try:
        for slice_metrics in tfma.load_metrics(uri):
            if slice_metrics.slice_key.single_slice_keys:  # overall slice only
                continue
            for entry in slice_metrics.metric_keys_and_values:
                if entry.key.is_diff or not entry.value.HasField("double_value"):
                    continue
                per_model.setdefault(entry.key.model_name, {})[entry.key.name] = float(
                    entry.value.double_value.value
                )
    except Exception:  # noqa: BLE001 - a missing or unreadable evaluation just means no metrics
        return {}, ()
    failures: list[tuple[str, str]] = []
    try:
        validation = tfma.load_validation_result(uri)
    except Exception:  # noqa: BLE001 - no validation result: nothing to explain
        validation = None
    for per_slice in validation.metric_validations_per_slice if validation else ():
        for failure in per_slice.failures:
            kind = "baseline" if failure.metric_threshold.HasField("change_threshold") else "bound"
            failures.append((kind, failure.metric_key.name))
    return per_model, tuple(failures)


def _pushed_version(store: metadata_store.MetadataStore, model_id: int) -> str | None:
    """The version folder a Pusher published the Model artifact `model_id` as, or None."""
    consumers = {
        event.execution_id
        for event in store.get_events_by_artifact_ids([model_id])
        if event.type == metadata_store_pb2.Event.INPUT
    }
    if not consumers:
        return None
    outputs = [
        event.artifact_id
        for event in store.get_events_by_execution_ids(sorted(consumers))
        if event.type == metadata_store_pb2.Event.OUTPUT
    ]
    for artifact in store.get_artifacts_by_id(outputs) if outputs else ():
        if _prop(artifact, "pushed") and _prop(artifact, "pushed_version") is not None:
            return str(_prop(artifact, "pushed_version"))
    return None


def _evaluation(
    store: metadata_store.MetadataStore, evaluator: ComponentOutcome | None
) -> Evaluation | None:
    """The Evaluator's findings in this run, or None when it did not get as far."""
    if evaluator is None:
        return None
    evaluations = evaluator.outputs.get("evaluation", [])
    blessings = evaluator.outputs.get("blessing", [])
    if not evaluations:
        return None
    per_model, failures = _read_evaluation(evaluations[0]["uri"])
    blessing = blessings[0]["properties"] if blessings else {}
    candidate = ModelEvaluation(
        model_uri=blessing.get("current_model"),
        model_id=blessing.get("current_model_id"),
        metrics=per_model.get("candidate", per_model.get("", {})),
    )
    baseline = None
    if blessing.get("baseline_model_id") is not None:
        baseline_id = int(blessing["baseline_model_id"])
        baseline = ModelEvaluation(
            model_uri=blessing.get("baseline_model"),
            model_id=baseline_id,
            metrics=per_model.get("baseline", {}),
            pushed_version=_pushed_version(store, baseline_id),
        )
    return Evaluation(candidate=candidate, baseline=baseline, failures=failures)


def read_latest_run(mlmd_path: str) -> RunOutcome | None:
    """Returns the newest pipeline run recorded in `mlmd_path`, or None when there is none."""
    if not os.path.exists(mlmd_path):
        return None
    store = open_store(mlmd_path)
    run = latest_run(store)
    if run is None:
        return None
    executions = run_executions(store, run)
    components: dict[str, ComponentOutcome] = {}
    artifact_ids: dict[int, list[tuple[str, int]]] = {}
    for event in store.get_events_by_execution_ids([e.execution.id for e in executions]):
        if event.type in (
            metadata_store_pb2.Event.OUTPUT,
            metadata_store_pb2.Event.DECLARED_OUTPUT,
        ):
            key = event.path.steps[0].key if event.path.steps else "output"
            artifact_ids.setdefault(event.execution_id, []).append((key, event.artifact_id))
    all_ids = sorted({aid for pairs in artifact_ids.values() for _, aid in pairs})
    artifacts = {a.id: a for a in store.get_artifacts_by_id(all_ids)} if all_ids else {}
    for run_execution in executions:
        execution = run_execution.execution
        outputs: dict[str, list[dict[str, Any]]] = {}
        for key, aid in artifact_ids.get(execution.id, []):
            artifact = artifacts.get(aid)
            if artifact is None:
                continue
            outputs.setdefault(key, []).append(
                {
                    "uri": artifact.uri,
                    "id": artifact.id,
                    "properties": {
                        name: _prop(artifact, name)
                        for name in (
                            *artifact.custom_properties.keys(),
                            *artifact.properties.keys(),
                        )
                    },
                }
            )
        node = run_execution.component
        components[node] = ComponentOutcome(
            component=node,
            state=run_execution.state,
            seconds=run_execution.seconds,
            execution_id=execution.id,
            outputs=outputs,
        )

    blessed = False
    evaluator = components.get("Evaluator")
    if evaluator:
        for blessing in evaluator.outputs.get("blessing", []):
            blessed = blessed or bool(blessing["properties"].get("blessed"))
    evaluation = _evaluation(store, evaluator)
    pushed_dir = pushed_version = None
    pusher = components.get("Pusher")
    if pusher and pusher.state in ("complete", "cached"):
        for pushed in pusher.outputs.get("pushed_model", []):
            if pushed["properties"].get("pushed"):
                pushed_dir = pushed["properties"].get("pushed_destination")
                pushed_version = pushed["properties"].get("pushed_version")
    training_summary = None
    trainer = components.get("Trainer")
    if trainer:
        for model_run in trainer.outputs.get("model_run", []):
            path = os.path.join(model_run["uri"], SUMMARY_FILE)
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    training_summary = json.load(f)
    return RunOutcome(
        run_id=run.name,
        components=components,
        blessed=blessed,
        pushed_model_dir=pushed_dir,
        pushed_version=str(pushed_version) if pushed_version is not None else None,
        eval_metrics=dict(evaluation.candidate.metrics) if evaluation else {},
        training_summary=training_summary,
        evaluation=evaluation,
    )
