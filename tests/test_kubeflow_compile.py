"""`fullthrottle compile --target kubeflow`: the real KubeflowV2DagRunner output, written as KFP's
pipeline IR YAML and read back through KFP's own loader and protos. Two compiles (about 10 s each
here) serve most tests in this file: a volume-path root with a Flink runner, caching off, a GPU
asked for; an object-store root with the TFJob Trainer."""

from __future__ import annotations

import importlib
import json

import pytest
import yaml
from google.protobuf import json_format
from kfp import components
from kfp.kubernetes import kubernetes_executor_config_pb2
from kfp.pipeline_spec import pipeline_spec_pb2

from fullthrottle import cli
from fullthrottle.core.config import StepResources, load_config
from fullthrottle.core.errors import ConfigError
from pipelines.kubeflow_v2_runner import ENTRYPOINT, compile_pipeline, iter_tasks, resource_spec

IMAGE = "registry.example.com/team/fullthrottle:1.2.3"  # the Dockerfile's gpu target
CPU_IMAGE = "registry.example.com/team/fullthrottle:1.2.3-cpu"  # its cpu target
FLINK_ARGS = [
    "--runner=FlinkRunner",
    "--flink_master=flink-jobmanager.flink:8081",
    "--environment_type=EXTERNAL",
    "--environment_config=localhost:50000",
]
BEAM_STEPS = ("ArrowExampleGen", "StatisticsGen", "Transform", "Evaluator")
NON_BEAM_STEPS = ("Trainer", "Pusher")


def _parse(pipeline_spec: dict) -> pipeline_spec_pb2.PipelineSpec:
    return json_format.ParseDict(pipeline_spec, pipeline_spec_pb2.PipelineSpec())


def _containers(spec: pipeline_spec_pb2.PipelineSpec) -> dict:
    deployment = json_format.ParseDict(
        json_format.MessageToDict(spec.deployment_spec),
        pipeline_spec_pb2.PipelineDeploymentConfig(),
    )
    out = {}
    for name, task in iter_tasks(spec):
        label = spec.components[task.component_ref.name].executor_label
        if label and deployment.executors[label].HasField("container"):
            out[name] = deployment.executors[label].container
    return out


def _exec_property(spec: pipeline_spec_pb2.PipelineSpec, task_name: str, key: str):
    tasks = dict(iter_tasks(spec))
    runtime_value = json_format.MessageToDict(tasks[task_name].inputs.parameters[key].runtime_value)
    # TFX writes the (deprecated) typed `constantValue`; newer compilers write `constant`.
    if "constantValue" in runtime_value:
        return next(iter(runtime_value["constantValue"].values()))
    return runtime_value.get("constant")


@pytest.fixture(scope="module")
def volume_spec(tmp_path_factory):
    """Through the CLI: volume root, Flink Beam args, custom per-step resources, caching off."""
    output = tmp_path_factory.mktemp("kf") / "spec.yaml"
    overrides = [
        f"kubeflow.beam_args={json.dumps(FLINK_ARGS)}",
        "kubeflow.resources.trainer.accelerator_count=2",
        "kubeflow.resources.transform.cpu_request=3",
        "kubeflow.resources.transform.memory_limit=12Gi",
    ]
    argv = ["compile", "--target", "kubeflow", "-o", str(output), "--image", IMAGE]
    argv += ["--cpu-image", CPU_IMAGE]
    argv += ["--pipeline-root", "/mnt/fullthrottle/pipelines/root", "--no-cache"]
    for item in overrides:
        argv += ["--set", item]
    assert cli.main(argv) == 0
    # What the KFP UI and kfp.Client upload: KFP's own loader reads it.
    loaded = components.load_component_from_file(str(output))
    pipeline_spec, platform_spec = yaml.safe_load_all(output.read_text())
    assert loaded.pipeline_spec == _parse(pipeline_spec)
    assert json_format.MessageToDict(loaded.platform_spec) == platform_spec
    return pipeline_spec, _parse(pipeline_spec), platform_spec


@pytest.fixture(scope="module")
def tfjob_spec():
    """In-process: object-store root, the multi-worker TFJob Trainer, caching on."""
    config = load_config(
        preset="multi_worker",
        overrides=[
            "kubeflow.pipeline_root=gs://team-bucket/pipelines",
            "kubeflow.tfjob.enabled=true",
            "kubeflow.tfjob.workers=3",
            f"kubeflow.cpu_image={CPU_IMAGE}",
        ],
    )
    compiled = compile_pipeline(config)
    return compiled.pipeline_spec, _parse(compiled.pipeline_spec), compiled.platform_spec


def test_dag_has_every_step_and_the_data_edges(volume_spec):
    _, spec, _ = volume_spec
    tasks = dict(iter_tasks(spec))
    for step in (*BEAM_STEPS, "ExampleValidator", "Trainer", "Pusher"):
        assert step in tasks, f"{step} missing from the DAG: {sorted(tasks)}"
    assert any("Schema" in name for name in tasks), sorted(tasks)
    edges = {name: set(task.dependent_tasks) for name, task in tasks.items()}
    assert "ArrowExampleGen" in edges["StatisticsGen"]
    assert "ArrowExampleGen" in edges["Transform"]
    assert "Transform" in edges["Trainer"]
    assert {"Trainer", "ArrowExampleGen"} <= edges["Evaluator"]
    assert {"Trainer", "Evaluator"} <= edges["Pusher"]
    assert not edges["ArrowExampleGen"], "ExampleGen must be a root of the DAG"


def test_image_and_command_of_every_step(volume_spec):
    _, spec, _ = volume_spec
    containers = _containers(spec)
    assert set(BEAM_STEPS) | set(NON_BEAM_STEPS) <= set(containers)
    for name, container in containers.items():
        # The GPU-capable image where a GPU is requested, the smaller one everywhere else.
        wants_gpu = container.resources.accelerator.resource_type == "nvidia.com/gpu"
        assert wants_gpu == (name == "Trainer"), name
        assert container.image == (IMAGE if wants_gpu else CPU_IMAGE), name
        assert tuple(container.command) == ENTRYPOINT, name


def test_without_a_cpu_image_every_step_runs_the_one_image():
    from pipelines.kubeflow_v2_runner import image_for

    config = load_config(overrides=[f"kubeflow.image={IMAGE}"])
    resources = config.kubeflow.resources
    assert image_for(config, resources.for_step("trainer")) == IMAGE
    assert image_for(config, resources.for_step("transform")) == IMAGE
    with pytest.raises(ConfigError, match=r"kubeflow\.cpu_image"):
        load_config(overrides=['kubeflow.cpu_image="two words"'])


def test_beam_args_reach_the_data_steps_only(volume_spec):
    _, spec, _ = volume_spec
    containers = _containers(spec)
    for name in BEAM_STEPS:
        args = list(containers[name].args)
        assert args[-len(FLINK_ARGS) :] == FLINK_ARGS, f"{name} args: {args}"
    # ExampleGen's driver (run before the cache check) gets them too.
    assert (
        list(containers["ArrowExampleGen"].lifecycle.pre_cache_check.args)[-len(FLINK_ARGS) :]
        == FLINK_ARGS
    )
    for name in NON_BEAM_STEPS:
        assert not set(FLINK_ARGS) & set(containers[name].args), f"{name} got Beam args"


@pytest.mark.parametrize(
    ("cpu", "memory", "cpu_cores", "memory_gb"),
    [
        ("500m", "1.5Gi", 0.5, 1.5 * 2**30 / 1e9),
        ("1e3", "512Mi", 1000.0, 2**29 / 1e9),
        ("2", "16G", 2.0, 16.0),
    ],
)
def test_resource_spec_reads_every_kubernetes_quantity_form(cpu, memory, cpu_cores, memory_gb):
    resources = StepResources(cpu_request=cpu, memory_limit=memory)
    spec = resource_spec(resources)
    # The string fields carry the quantity as written; the older numeric ones its value.
    assert (spec.resource_cpu_request, spec.resource_memory_limit) == (cpu, memory)
    assert spec.cpu_request == pytest.approx(cpu_cores)
    assert spec.memory_limit == pytest.approx(memory_gb)


def test_resources_per_step(volume_spec):
    _, spec, _ = volume_spec
    containers = _containers(spec)
    trainer = containers["Trainer"].resources
    assert (trainer.accelerator.resource_type, trainer.accelerator.resource_count) == (
        "nvidia.com/gpu",
        "2",
    )
    assert (trainer.accelerator.type, trainer.accelerator.count) == ("nvidia.com/gpu", 2)
    assert trainer.resource_cpu_request == "4" and trainer.resource_memory_limit == "32Gi"
    transform = containers["Transform"].resources
    assert transform.resource_cpu_request == "3" and transform.cpu_request == 3.0
    assert transform.resource_memory_limit == "12Gi"
    assert transform.memory_limit == pytest.approx(12 * 2**30 / 1e9)
    for name, container in containers.items():
        if name == "Trainer":
            continue
        assert not container.resources.accelerator.resource_type, f"{name} asks for an accelerator"
        assert container.resources.resource_memory_request == "4Gi", name
        if name != "Transform":
            assert container.resources.resource_cpu_request == "2", name


def test_caching_flags(volume_spec, tfjob_spec):
    for (_, spec, _), expected in ((volume_spec, False), (tfjob_spec, True)):
        for name, task in iter_tasks(spec):
            if spec.components[task.component_ref.name].executor_label:
                assert task.HasField("caching_options"), name
                assert task.caching_options.enable_cache is expected, name


def test_pipeline_root_volume_and_object_store_pass_through(volume_spec, tfjob_spec):
    assert (
        volume_spec[0]["defaultPipelineRoot"]
        == "/mnt/fullthrottle/pipelines/root/fullthrottle-penguins"
    )
    assert (
        tfjob_spec[0]["defaultPipelineRoot"] == "gs://team-bucket/pipelines/fullthrottle-penguins"
    )
    pusher_config = json.dumps(tfjob_spec[0]["root"])
    assert "/mnt/fullthrottle/serving/penguins" in pusher_config


def _pvc_mounts(platform_spec: dict) -> dict[str, list]:
    """Executor label -> its PVC mounts, read through kfp-kubernetes' own proto."""
    executors = platform_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    return {
        label: list(
            json_format.ParseDict(
                config, kubernetes_executor_config_pb2.KubernetesExecutorConfig()
            ).pvc_mount
        )
        for label, config in executors.items()
    }


def test_every_step_mounts_the_volume_of_the_default_roots(volume_spec, tfjob_spec):
    for pipeline_spec, _, platform_spec in (volume_spec, tfjob_spec):
        containers = {
            label
            for label, executor in pipeline_spec["deploymentSpec"]["executors"].items()
            if "container" in executor
        }
        mounts = _pvc_mounts(platform_spec)
        assert set(mounts) == containers and len(containers) >= 8
        for label, (mount,) in mounts.items():
            assert mount.mount_path == "/mnt/fullthrottle", label
            assert mount.pvc_name_parameter.runtime_value.constant.string_value == "fullthrottle"
            assert mount.constant == "fullthrottle"  # the field older KFP backends read


def test_no_volume_when_every_root_is_in_an_object_store():
    config = load_config(
        overrides=[
            "kubeflow.volume.claim_name=null",
            "kubeflow.pipeline_root=gs://b/root",
            "kubeflow.input_base=gs://b/data",
            "kubeflow.serving_dir=gs://b/serving",
        ]
    )
    compiled = compile_pipeline(config)
    assert compiled.platform_spec == {}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["kubeflow.pipeline_root=s3://bucket/root"], r"tensorflow-io.*Python 3\.13"),
        (["kubeflow.input_base=hdfs://nn/data"], r"kubeflow\.input_base.*libhdfs"),
        (["kubeflow.serving_dir=relative/serving"], r"kubeflow\.serving_dir.*relative"),
        (["kubeflow.pipeline_root=/data/root"], r"not under the volume.*/mnt/fullthrottle"),
        (["kubeflow.volume.claim_name=null"], r"claim_name.*null.*lost"),
        (["kubeflow.volume.claim_name=Not_A_Name"], r"kubeflow\.volume\.claim_name"),
    ],
)
def test_roots_the_pods_cannot_keep_are_refused_before_compiling(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compile_pipeline(load_config(overrides=overrides))


def test_the_trainer_asks_for_a_gpu_only_when_the_config_does():
    from pipelines.kubeflow_v2_runner import wants_accelerator

    def trainer(**kwargs):
        return load_config(**kwargs).kubeflow.resources.for_step("trainer")

    # A CPU-only cluster's first run must schedule: no step asks for a GPU by default.
    config = load_config()
    for step in ("trainer", "transform", "default"):
        assert not wants_accelerator(config.kubeflow.resources.for_step(step)), step
    assert not wants_accelerator(trainer(preset="cpu"))
    assert not wants_accelerator(trainer(preset="multi_worker"))
    gpu = trainer(preset="gpu")
    assert (gpu.accelerator_type, gpu.accelerator_count) == ("nvidia.com/gpu", 1)
    assert trainer(preset="multi_gpu").accelerator_count == 2
    asked = trainer(overrides=["kubeflow.resources.trainer.accelerator_count=4"])
    assert (asked.accelerator_type, asked.accelerator_count) == ("nvidia.com/gpu", 4)


def test_user_code_is_reached_by_names_the_image_contains(volume_spec):
    _, spec, _ = volume_spec
    assert (
        _exec_property(spec, "Transform", "preprocessing_fn")
        == "trainer_module.transform.preprocessing_fn"
    )
    assert _exec_property(spec, "Trainer", "run_fn") == "trainer_module.run.run_fn"
    dotted = ["trainer_module.transform.preprocessing_fn", "trainer_module.run.run_fn"]
    for container in _containers(spec).values():
        args = list(container.args)
        dotted.append(args[args.index("--executor_class_path") + 1])
    for name in dotted:
        module, attribute = name.rsplit(".", 1)
        assert callable(getattr(importlib.import_module(module), attribute)), name


def test_the_trainer_step_is_retried_after_a_preemption(volume_spec, tfjob_spec):
    retries = load_config().kubeflow.trainer_retries
    assert retries > 0
    for _, spec, _ in (volume_spec, tfjob_spec):
        policies = {name: task.retry_policy.max_retry_count for name, task in iter_tasks(spec)}
        assert policies.pop("Trainer") == retries
        assert set(policies.values()) == {0}  # the other steps fail as they did


def test_tfjob_trainer_step(tfjob_spec):
    _, spec, _ = tfjob_spec
    trainer = _containers(spec)["Trainer"]
    args = list(trainer.args)
    assert args[args.index("--executor_class_path") + 1] == "components.tfjob_trainer.TFJobExecutor"
    # The step only waits for the TFJob: no GPU for it, so the small image; the replicas get
    # the Trainer's resources (no GPU unless asked: the small image too) and the volume.
    assert not trainer.resources.accelerator.resource_type
    assert trainer.image == CPU_IMAGE
    custom = json.loads(_exec_property(spec, "Trainer", "custom_config"))
    tfjob = custom["fullthrottle_tfjob"]
    assert tfjob["workers"] == 3
    assert tfjob["resources"]["accelerator_count"] == 0
    assert tfjob["image"] == CPU_IMAGE
    assert tfjob["volume"] == {"claim_name": "fullthrottle", "mount_path": "/mnt/fullthrottle"}
    assert custom["training"]["strategy"] == "multi_worker"


def test_step_counts_reach_the_trainer_by_train_and_eval_args_only(tfjob_spec):
    _, spec, _ = tfjob_spec
    custom = json.loads(_exec_property(spec, "Trainer", "custom_config"))
    assert "train_steps" not in custom["training"]
    assert "eval_steps" not in custom["training"]
    train_args = json.loads(_exec_property(spec, "Trainer", "train_args"))
    assert int(train_args["num_steps"]) == load_config().training.train_steps


def test_tfjob_with_a_single_worker_strategy_is_refused_before_compiling():
    config = load_config(overrides=["kubeflow.tfjob.enabled=true", "training.strategy=mirrored"])
    with pytest.raises(ConfigError, match=r"kubeflow\.tfjob\.workers.*training\.strategy"):
        compile_pipeline(config)


def test_the_output_is_named_as_the_yaml_it_is(tmp_path, capsys):
    assert cli.main(["compile", "-o", str(tmp_path / "spec.json")]) == 2
    # The message is wrapped to the terminal's width, wherever the long path puts the breaks.
    assert "name the file .yaml" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "spec.json").exists()


def test_bad_config_overwrites_nothing(tmp_path, capsys):
    output = tmp_path / "spec.yaml"
    output.write_text('{"kept": true}')
    code = cli.main(
        ["compile", "-o", str(output), "--set", "kubeflow.beam_args=[--runner=DataflowRunner]"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "kubeflow.beam_args" in err and "--project" in err and "--temp_location" in err
    assert json.loads(output.read_text()) == {"kept": True}


def test_curated_schema_is_read_from_the_image_copy_of_the_project():
    """Bundled data imports the curated schema: the compiled spec must name the image's path."""
    import json

    from fullthrottle.core.config import load_config
    from pipelines.kubeflow_v2_runner import IMAGE_PROJECT_ROOT, compile_pipeline

    compiled = compile_pipeline(load_config())
    text = json.dumps(compiled.pipeline_spec)
    assert f"{IMAGE_PROJECT_ROOT}/fullthrottle/core/bundled_data/penguins.pbtxt" in text
    assert "/work/main/fullthrottle/schemas" not in text
