"""What a pipeline run did, read back from ML Metadata (the record TFX itself keeps).

One function reads the newest run of a pipeline: each component's state and duration, whether
the model was blessed and pushed and where, the evaluation metrics and the trainer's summary.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from trainer_module.training.results import SUMMARY_FILE

_STATES = {
    metadata_store_pb2.Execution.NEW: "new",
    metadata_store_pb2.Execution.RUNNING: "running",
    metadata_store_pb2.Execution.COMPLETE: "complete",
    metadata_store_pb2.Execution.FAILED: "failed",
    metadata_store_pb2.Execution.CACHED: "cached",
    metadata_store_pb2.Execution.CANCELED: "canceled",
}


@dataclass
class ComponentOutcome:
    component: str
    state: str
    seconds: float
    execution_id: int
    outputs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass
class RunOutcome:
    run_id: str
    components: dict[str, ComponentOutcome]
    blessed: bool
    pushed_model_dir: str | None
    pushed_version: str | None
    eval_metrics: dict[str, float]
    training_summary: dict[str, Any] | None


def _store(mlmd_path: str) -> metadata_store.MetadataStore:
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = mlmd_path
    config.sqlite.connection_mode = (
        metadata_store_pb2.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
    )
    return metadata_store.MetadataStore(config)


def _prop(artifact: Any, name: str) -> Any:
    for props in (artifact.custom_properties, artifact.properties):
        if name in props:
            value = props[name]
            kind = value.WhichOneof("value")
            return getattr(value, kind) if kind else None
    return None


def _load_eval_metrics(uri: str) -> dict[str, float]:
    import tensorflow_model_analysis as tfma

    try:
        result = tfma.load_eval_result(uri)
    except Exception:  # noqa: BLE001 - a missing or unreadable evaluation just means no metrics
        return {}
    metrics: dict[str, float] = {}
    for slice_key, slice_metrics in result.slicing_metrics:
        if slice_key:  # overall slice only
            continue
        for output in slice_metrics.values():
            for sub_key in output.values():
                for name, value in sub_key.items():
                    if "doubleValue" in value:
                        metrics[name] = float(value["doubleValue"])
    return metrics


def read_latest_run(mlmd_path: str) -> RunOutcome | None:
    """Returns the newest pipeline run recorded in `mlmd_path`, or None when there is none."""
    if not os.path.exists(mlmd_path):
        return None
    store = _store(mlmd_path)
    runs = store.get_contexts_by_type("pipeline_run")
    if not runs:
        return None
    run = max(runs, key=lambda c: (c.create_time_since_epoch, c.id))
    executions = sorted(store.get_executions_by_context(run.id), key=lambda e: e.id)
    components: dict[str, ComponentOutcome] = {}
    artifact_ids: dict[int, list[tuple[str, int]]] = {}
    for event in store.get_events_by_execution_ids([e.id for e in executions]):
        if event.type in (
            metadata_store_pb2.Event.OUTPUT,
            metadata_store_pb2.Event.DECLARED_OUTPUT,
        ):
            key = event.path.steps[0].key if event.path.steps else "output"
            artifact_ids.setdefault(event.execution_id, []).append((key, event.artifact_id))
    all_ids = sorted({aid for pairs in artifact_ids.values() for _, aid in pairs})
    artifacts = {a.id: a for a in store.get_artifacts_by_id(all_ids)} if all_ids else {}
    for execution in executions:
        node = next(
            (
                c.name.split(".", 1)[-1]
                for c in store.get_contexts_by_execution(execution.id)
                if c.type == "node"
            ),
            str(execution.type_id),
        )
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
        seconds = max(
            0.0,
            (execution.last_update_time_since_epoch - execution.create_time_since_epoch) / 1000.0,
        )
        components[node] = ComponentOutcome(
            component=node,
            state=_STATES.get(execution.last_known_state, "unknown"),
            seconds=seconds,
            execution_id=execution.id,
            outputs=outputs,
        )

    blessed = False
    eval_metrics: dict[str, float] = {}
    evaluator = components.get("Evaluator")
    if evaluator:
        for blessing in evaluator.outputs.get("blessing", []):
            blessed = blessed or bool(blessing["properties"].get("blessed"))
        for evaluation in evaluator.outputs.get("evaluation", []):
            eval_metrics = _load_eval_metrics(evaluation["uri"])
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
        eval_metrics=eval_metrics,
        training_summary=training_summary,
    )
