"""The compiled Kubeflow pipeline, run end to end here: its tasks as local processes.

The closest to a Kubeflow run these machines allow (no cluster, no KFP backend, no images): the
spec `fullthrottle compile` writes with MLFLOW_TRACKING_URI set, each task's container command
and arguments exactly as written there (the images' entrypoint, TFX's Kubeflow V2 executor
launcher) with the executor input KFP's driver would pass (`tests/kfp_local.py`), in DAG order,
against a local pipeline root and a real `mlflow server`. The processes do not have
MLFLOW_TRACKING_URI: the Trainer's link to MLflow comes from the spec. Not covered: the KFP
backend's driver, launcher and cache, pods, images and volumes, the TFJob operator.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from fullthrottle.core.bundled import schema_path_for
from fullthrottle.core.config import load_config
from fullthrottle.core.staging import prepare_data
from fullthrottle.tracking import remote_trainer_link
from fullthrottle.tracking.names import CREATED_BY_TAG, PIPELINE_KEY_TAG
from pipelines.kubeflow_v2_runner import (
    ENTRYPOINT,
    CompiledPipeline,
    compile_pipeline,
    kubeflow_paths,
)
from tests.helpers import REPO, served_dirs
from tests.kfp_local import local_env, run_spec
from tests.tracking_server import MlflowServer

pytestmark = [pytest.mark.slow, pytest.mark.external]

TRAIN_STEPS = 200
ORDER = ("ArrowExampleGen", "StatisticsGen", "ExampleValidator", "DataGate", "Transform",
         "Trainer", "Evaluator", "Pusher")  # fmt: skip


def _compile(root: Path, tracking_uri: str) -> tuple[CompiledPipeline, object]:
    """`fullthrottle compile --target kubeflow` with MLFLOW_TRACKING_URI set, as the command
    does it (config, the Trainer's link from the environment, compile)."""
    # The schema is read by the ImportSchema pod: a URI it reaches, not this project's path.
    schema = root / "schema" / "penguins.pbtxt"
    schema.parent.mkdir(parents=True, exist_ok=True)
    config = load_config(
        overrides=[
            f"output_dir={root / 'local'}",
            # `root` stands for the volume every pod mounts.
            f"kubeflow.volume.mount_path={root}",
            f"kubeflow.pipeline_root={root / 'pipeline_root'}",
            f"kubeflow.input_base={root / 'data'}",
            f"kubeflow.serving_dir={root / 'serving'}",
            "kubeflow.beam_args=[]",
            f"data.schema_path=file://{schema}",
            f"training.train_steps={TRAIN_STEPS}",
            "tracking.system_metrics_interval_seconds=1",
        ]
    )
    shutil.copyfile(schema_path_for(load_config().data), schema)
    paths = kubeflow_paths(config)
    environ = {"MLFLOW_TRACKING_URI": tracking_uri}
    from fullthrottle.tracking.store import resolve_destination

    assert resolve_destination(config, environ).uri == tracking_uri
    import os

    previous = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = tracking_uri
    try:
        link = remote_trainer_link(config, pipeline_root=paths["pipeline_root"])
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_TRACKING_URI")
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous
    return compile_pipeline(config, trainer_tracking=link), config


@pytest.fixture(scope="module")
def kubeflow_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("kubeflow_run")
    server = MlflowServer(root / "mlflow")
    try:
        compiled, config = _compile(root, server.uri)
        # What `fullthrottle run` stages before ExampleGen; on Kubeflow it is copied to input_base.
        prepared = prepare_data(load_config(overrides=[f"output_dir={root / 'local'}"]))
        shutil.copytree(prepared.input_base, root / "data")
        (root / "tmp").mkdir()
        runs = run_spec(
            compiled.pipeline_spec,
            pipeline_root=compiled.pipeline_root,
            env=local_env(REPO, root / "tmp"),
            log_dir=root / "logs",
        )
        yield root, compiled, runs, server, config
    finally:
        server.stop()


def _trainer_custom_config(compiled: CompiledPipeline) -> dict:
    value = compiled.pipeline_spec["root"]["dag"]["tasks"]["Trainer"]["inputs"]["parameters"]
    return json.loads(value["custom_config"]["runtimeValue"]["constant"])


def test_every_task_runs_the_spec_s_command_and_a_model_is_pushed(kubeflow_run):
    root, compiled, runs, _, _ = kubeflow_run
    ran = [name for name, run in runs.items() if run.ran]
    assert set(ORDER) <= set(ran), ran
    assert [n for n in ran if n in ORDER] == list(ORDER)  # DAG order
    executors = compiled.pipeline_spec["deploymentSpec"]["executors"]
    for name in ORDER:
        command = runs[name].commands[-1]
        container = executors[f"{name}_executor"]["container"]
        assert tuple(command[:3]) == ENTRYPOINT, (name, command[:3])
        assert command[3:5] == container["args"][:2]  # --executor_class_path <the executor>
        executor_input = json.loads(command[command.index("--json_serialized_invocation_args") + 1])
        assert executor_input["inputs"].get("parameterValues") or name in ("DataGate",), name
    # ExampleGen's driver ran first, as the spec's preCacheCheck asks.
    assert "file_based_example_gen.driver" in " ".join(runs["ArrowExampleGen"].commands[0])
    pushed = runs["Pusher"].outputs["pushed_model"][0]["metadata"]
    assert pushed["pushed"] == 1
    versions = served_dirs(root / "serving" / "penguins")
    assert len(versions) == 1 and (versions[0] / "saved_model.pb").exists()
    assert pushed["pushed_destination"] == str(versions[0])


def test_the_trainer_tracks_into_mlflow_from_the_spec_s_link(kubeflow_run):
    root, compiled, _, server, config = kubeflow_run
    link = _trainer_custom_config(compiled)["tracking"]
    assert link["uri"] == server.uri and "parent_run_id" not in link
    client = MlflowClient(server.uri)
    experiment = client.get_experiment_by_name(config.pipeline_name)
    (parent,) = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{PIPELINE_KEY_TAG}` = '{link['pipeline_key']}'",
    )
    # No `fullthrottle run` here: the Trainer made the pipeline run, and ended it.
    assert parent.info.status == "FINISHED"
    assert parent.data.tags[CREATED_BY_TAG] == "Trainer"
    assert parent.data.tags["mlflow.user"] and parent.data.tags["mlflow.source.name"]
    assert parent.data.params["training.train_steps"] == str(TRAIN_STEPS)
    assert parent.data.params["data.label"] == "species"
    assert parent.data.params["derived.global_batch_size"]
    (trainer,) = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
    )
    assert trainer.info.status == "FINISHED"
    assert trainer.data.tags["fullthrottle.component"] == "Trainer"
    loss = client.get_metric_history(trainer.info.run_id, "train/loss")
    assert [m.step for m in loss] == sorted({m.step for m in loss}) and loss[-1].step == TRAIN_STEPS
    assert 0 < trainer.data.metrics["eval/accuracy"] <= 1
    assert any(k.startswith("system/cpu") for k in trainer.data.metrics)


def test_the_link_is_the_same_in_every_compile_so_caching_holds(kubeflow_run, tmp_path):
    root, compiled, _, server, _ = kubeflow_run
    again, _ = _compile(root, server.uri)
    # TFX and KFP key the Trainer's cache on its parameters: nothing in them changes per run.
    assert _trainer_custom_config(again) == _trainer_custom_config(compiled)
