"""The multi-worker Trainer as a TFJob: the manifest generated from the config, the command every
replica runs, reading the job's state, and failing clearly when the cluster is not there.

No Kubernetes cluster exists here. The manifest is checked against the TFJob v1 schema's required
fields (deploy/kubeflow/tfjob-v1-schema.json, transcribed from the Training Operator's CRD); the
replica command is parsed by TFX's own `run_executor` argument parser; the client is the real
`kubernetes` client pointed at a closed port."""

from __future__ import annotations

import base64
import json
import socket
from pathlib import Path

import jsonschema
import pytest
from tfx.scripts import run_executor
from tfx.types import artifact_utils, standard_artifacts

from components.tfjob_manifest import build_tfjob_manifest, job_state, tfjob_name
from components.tfjob_trainer import (
    WORKER_COMMAND,
    TFJobError,
    run_tfjob,
    tfjob_settings,
    worker_args,
)
from fullthrottle.core.config import load_config

CPU_IMAGE = "registry.example.com/fullthrottle:0.1.0-cpu"
SCHEMA = json.loads(
    (Path(__file__).resolve().parent.parent / "deploy/kubeflow/tfjob-v1-schema.json").read_text()
)


def _artifacts(root: Path):
    examples = standard_artifacts.Examples()
    examples.uri = str(root / "Transform/transformed_examples/5")
    examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
    graph = standard_artifacts.TransformGraph()
    graph.uri = str(root / "Transform/transform_graph/5")
    model = standard_artifacts.Model()
    model.uri = str(root / "Trainer/model/7")
    model_run = standard_artifacts.ModelRun()
    model_run.uri = str(root / "Trainer/model_run/7")
    inputs = {"examples": [examples], "transform_graph": [graph]}
    outputs = {"model": [model], "model_run": [model_run]}
    exec_properties = {
        "run_fn": "trainer_module.run.run_fn",
        "custom_config": json.dumps({"training": {}}),
    }
    return inputs, outputs, exec_properties


def _manifest(
    workers: int, tmp_path: Path, *, gpus_per_replica: int = 4, extra: tuple[str, ...] = ()
) -> dict:
    config = load_config(
        preset="multi_worker",
        overrides=[
            "kubeflow.tfjob.enabled=true",
            f"kubeflow.tfjob.workers={workers}",
            f"kubeflow.tfjob.resources.accelerator_count={gpus_per_replica}",
            "kubeflow.namespace=ml-team",
            f"kubeflow.cpu_image={CPU_IMAGE}",
            *extra,
        ],
    )
    settings = tfjob_settings(config)
    inputs, outputs, exec_properties = _artifacts(tmp_path)
    name = tfjob_name(pipeline_name=config.pipeline_name, execution_key=outputs["model"][0].uri)
    return build_tfjob_manifest(
        settings,
        name=name,
        command=WORKER_COMMAND,
        args=worker_args(inputs, outputs, exec_properties),
    )


@pytest.mark.parametrize("workers", [1, 3])
def test_manifest_is_a_valid_tfjob_with_the_chief_counted(workers, tmp_path):
    manifest = _manifest(workers, tmp_path)
    jsonschema.validate(manifest, SCHEMA)
    replicas = manifest["spec"]["tfReplicaSpecs"]
    assert replicas["Chief"]["replicas"] == 1
    assert replicas.get("Worker", {}).get("replicas", 0) == workers - 1
    assert manifest["metadata"]["namespace"] == "ml-team"
    for spec in replicas.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow"  # the operator's TensorFlow container
        assert container["image"] == load_config().kubeflow.image
        # Trainer resources from kubeflow.resources.trainer, the accelerator count from tfjob.
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
        assert container["resources"]["requests"] == {"cpu": "4", "memory": "16Gi"}


def test_preempted_replicas_have_time_to_checkpoint_and_are_restarted(tmp_path):
    default = _manifest(2, tmp_path)
    manifest = _manifest(
        3,
        tmp_path,
        extra=("kubeflow.termination_grace_period_seconds=900", "kubeflow.trainer_retries=5"),
    )
    jsonschema.validate(manifest, SCHEMA)
    assert default["spec"]["runPolicy"]["backoffLimit"] == load_config().kubeflow.trainer_retries
    assert manifest["spec"]["runPolicy"]["backoffLimit"] == 5
    for job, grace in (
        (default, load_config().kubeflow.termination_grace_period_seconds),
        (manifest, 900),
    ):
        for spec in job["spec"]["tfReplicaSpecs"].values():
            # SIGTERM, then this long before SIGKILL: the trainer saves at its next loop end.
            assert spec["template"]["spec"]["terminationGracePeriodSeconds"] == grace
            # A pod ended by a signal (exit 128+n) restarts and resumes; exit 1 does not.
            assert spec["restartPolicy"] == "ExitCode"


def test_replicas_without_gpus_run_the_cpu_image(tmp_path):
    manifest = _manifest(2, tmp_path, gpus_per_replica=0)
    jsonschema.validate(manifest, SCHEMA)
    for spec in manifest["spec"]["tfReplicaSpecs"].values():
        (container,) = spec["template"]["spec"]["containers"]
        assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
        assert container["image"] == CPU_IMAGE


def test_every_replica_runs_the_same_trainer_entrypoint(tmp_path):
    manifest = _manifest(3, tmp_path)
    commands = {
        json.dumps([c["command"], c["args"]])
        for spec in manifest["spec"]["tfReplicaSpecs"].values()
        for c in spec["template"]["spec"]["containers"]
    }
    assert len(commands) == 1
    command, args = json.loads(commands.pop())
    assert command == ["python", "-m", "tfx.scripts.run_executor"]
    parsed, _ = run_executor.parse_flags(["run_executor", *args])
    assert parsed.executor_class_path == "components.tfjob_trainer.WorkerExecutor"
    inputs = artifact_utils.parse_artifact_dict(base64.b64decode(parsed.inputs_base64))
    outputs = artifact_utils.parse_artifact_dict(base64.b64decode(parsed.outputs_base64))
    properties = json.loads(base64.b64decode(parsed.exec_properties_base64))
    expected_inputs, expected_outputs, _ = _artifacts(tmp_path)
    assert inputs["examples"][0].uri == expected_inputs["examples"][0].uri
    assert artifact_utils.decode_split_names(inputs["examples"][0].split_names) == ["train", "eval"]
    assert outputs["model"][0].uri == expected_outputs["model"][0].uri
    # The same run_fn as the single-pod Trainer: the training library picks MWMS from TF_CONFIG.
    assert properties["run_fn"] == "trainer_module.run.run_fn"


def test_job_name_is_stable_per_execution_and_a_dns_label():
    first = tfjob_name(pipeline_name="My_Pipeline.v2", execution_key="gs://b/Trainer/model/7")
    assert first == tfjob_name(
        pipeline_name="My_Pipeline.v2", execution_key="gs://b/Trainer/model/7"
    )
    assert first != tfjob_name(
        pipeline_name="My_Pipeline.v2", execution_key="gs://b/Trainer/model/8"
    )
    jsonschema.validate(first, SCHEMA["properties"]["metadata"]["properties"]["name"])


@pytest.mark.parametrize(
    "conditions, expected",
    [
        (None, "Pending"),
        ([{"type": "Created", "status": "True"}], "Pending"),
        ([{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}], "Running"),
        (
            [{"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}],
            "Succeeded",
        ),
        (
            [
                {"type": "Running", "status": "False"},
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "TFJobFailed",
                    "message": "worker-1 exited 1",
                },
            ],
            "Failed",
        ),
    ],
)
def test_job_state_reads_the_last_true_condition(conditions, expected):
    state, message = job_state({"conditions": conditions} if conditions is not None else None)
    assert state == expected
    if expected == "Failed":
        assert "worker-1 exited 1" in message


def test_unreachable_cluster_fails_naming_the_job_and_the_api(tmp_path):
    from kubernetes import client, config

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    api = client.CustomObjectsApi(client.ApiClient(configuration))
    manifest = _manifest(2, tmp_path)
    with pytest.raises(TFJobError) as failure:
        run_tfjob(manifest, poll_seconds=1, api=api, sleep=lambda _: None)
    message = str(failure.value)
    assert f"127.0.0.1:{port}" in message
    assert manifest["metadata"]["name"] in message and "ml-team" in message
