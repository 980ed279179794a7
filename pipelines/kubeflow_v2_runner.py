"""Compiles the pipeline for Kubeflow Pipelines v2 with TFX's `KubeflowV2DagRunner`.

This module chooses the paths the pods see (`kubeflow.pipeline_root`, `input_base`,
`serving_dir`), the image, the Beam args of the data components and the Trainer variant, then calls
`pipelines.pipeline.create_pipeline`: the wiring lives there only. TFX sets resources only through
`with_platform_config`, which its compiler ignores for ExampleGen, and caching only pipeline-wide, so
per-step resources and caching flags are written into the compiled `PipelineSpec` afterwards
(`apply_step_settings`), the way the KFP SDK's own compiler writes them. TFX writes no platform
spec; the volume of the roots is added as KFP's Kubernetes platform spec (`kfp-kubernetes`'s
`PvcMount`, `volume_platform_spec`), and the result is written as the pipeline IR YAML the KFP
SDK's compiler writes (`write_compiled`), which `kfp.Client` and the KFP UI upload.

Nothing here touches the network: object-store roots (gs://) are passed through as strings.
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp.pipeline_spec import pipeline_spec_pb2
from kubernetes.utils import parse_quantity

from fullthrottle.core.config import Config, StepResources
from fullthrottle.core.errors import ConfigError
from fullthrottle.core.object_stores import scheme_of

# The container command of every step (TFX's v2 executor launcher); the Dockerfile's ENTRYPOINT
# is the same command, and tests/test_kubeflow_image.py keeps the two equal.
ENTRYPOINT = ("python", "-m", "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor")

# Component id (or class name) -> field of `kubeflow.resources`; other components (custom ones
# such as a data gate) get `kubeflow.resources.default`.
STEP_OF_COMPONENT: Mapping[str, str] = {
    "ArrowExampleGen": "example_gen",
    "ImportExampleGen": "example_gen",
    "StatisticsGen": "statistics_gen",
    "SchemaGen": "schema_gen",
    "ImportSchemaGen": "schema_gen",
    "ExampleValidator": "example_validator",
    "Transform": "transform",
    "Trainer": "trainer",
    "Evaluator": "evaluator",
    "Pusher": "pusher",
}

ContainerSpec = pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec


def _join(root: str, name: str) -> str:
    # posixpath keeps "gs://bucket" intact (os.path would too on Linux, but the pods' paths are
    # POSIX whatever machine compiles).
    return posixpath.join(root.rstrip("/") or "/", name)


def kubeflow_paths(config: Config) -> dict[str, str]:
    """Where the pods read and write: the pipeline name and model name are appended."""
    kf = config.kubeflow
    return {
        "input_base": kf.input_base,
        "pipeline_root": _join(kf.pipeline_root, config.pipeline_name),
        "serving_dir": _join(kf.serving_dir, config.model_name),
    }


def caching_enabled(config: Config) -> bool:
    kf = config.kubeflow
    return config.enable_cache if kf.enable_cache is None else kf.enable_cache


IMAGE_PROJECT_ROOT = "/opt/fullthrottle"


def on_volume(location: str, mount_path: str) -> bool:
    return location == mount_path or location.startswith(mount_path.rstrip("/") + "/")


def check_for_kubeflow(config: Config) -> None:
    """Refuses settings that would only fail inside the cluster, naming the field."""
    volume = config.kubeflow.volume
    for name in ("pipeline_root", "input_base", "serving_dir"):
        location = getattr(config.kubeflow, name)
        if scheme_of(location) is not None:
            continue
        if volume.claim_name is None:
            raise ConfigError(
                f"`kubeflow.{name}` {location!r} is a path, but `kubeflow.volume.claim_name` is "
                "null, so no volume holds it: it would be written inside the pod and lost. Name "
                "a PersistentVolumeClaim (kubeflow.volume.claim_name) or give a gs:// URI"
            )
        if not on_volume(location, volume.mount_path):
            raise ConfigError(
                f"`kubeflow.{name}` {location!r} is not under the volume's "
                f"`kubeflow.volume.mount_path` {volume.mount_path!r}: it would be written inside "
                "the pod and lost. Put it under the mount path, or give a gs:// URI"
            )
    tfjob = config.kubeflow.tfjob
    if (
        tfjob.enabled
        and tfjob.workers > 1
        and config.training.strategy in ("one_device", "mirrored")
    ):
        raise ConfigError(
            f"`kubeflow.tfjob.workers` is {tfjob.workers} but `training.strategy` is "
            f"{config.training.strategy!r}, so every worker would train alone: set "
            "training.strategy to 'auto' or 'multi_worker' (or use --preset multi_worker)"
        )
    if (
        config.data.schema_path
        and "://" not in config.data.schema_path
        and not config.data.schema_path.startswith(config.kubeflow.input_base)
    ):
        # ImportSchemaGen reads the file inside a pod: a path on this machine would not exist there.
        raise ConfigError(
            f"`data.schema_path` {config.data.schema_path!r} is a path on this machine; on Kubeflow it "
            "must be readable by the pods: put it under `kubeflow.input_base` or an object store URI"
        )


def build_kubeflow_pipeline(
    config: Config, *, trainer_tracking: Mapping[str, Any] | None = None
) -> Any:
    """The same pipeline as `fullthrottle run`, with the pods' paths and the Beam args for the
    cluster; no MLMD connection (KFP brings its own). `trainer_tracking`: the Trainer's MLflow
    link, for a tracking server the pods reach."""
    from pipelines.pipeline import create_pipeline

    check_for_kubeflow(config)
    paths = kubeflow_paths(config)
    trainer_factory = None
    if config.kubeflow.tfjob.enabled:
        from components.tfjob_trainer import tfjob_settings, tfjob_trainer

        trainer_factory = functools.partial(tfjob_trainer, tfjob=tfjob_settings(config))
    return create_pipeline(
        config,
        input_base=paths["input_base"],
        pipeline_root=paths["pipeline_root"],
        serving_dir=paths["serving_dir"],
        metadata_connection_config=None,
        beam_pipeline_args=list(config.kubeflow.beam_args),
        trainer_factory=trainer_factory,
        # The image installs the project here (Dockerfile: WORKDIR/COPY): shipped files such as
        # the curated schema are read from the image's copy.
        project_root=IMAGE_PROJECT_ROOT,
        trainer_tracking=trainer_tracking,
        # KFP's open-source backend runs container and importer tasks only ("non-container and
        # non-importer executor not implemented", kubeflow/pipelines
        # backend/src/v2/compiler/visitor.go): TFX compiles a Resolver into resolver tasks it
        # would refuse, so on Kubeflow the Evaluator blesses on the absolute bar alone.
        resolve_baseline=False,
    )


@dataclass(frozen=True)
class CompiledPipeline:
    """The two documents of KFP's pipeline IR YAML, as dicts of their protos' JSON form."""

    pipeline_spec: dict[str, Any]  # kfp.pipeline_spec PipelineSpec
    platform_spec: dict[str, Any]  # kfp.pipeline_spec PlatformSpec (the Kubernetes volume)

    @property
    def pipeline_root(self) -> str:
        return self.pipeline_spec["defaultPipelineRoot"]


def compile_pipeline(
    config: Config, *, trainer_tracking: Mapping[str, Any] | None = None
) -> CompiledPipeline:
    """Compiles to KFP's pipeline spec with per-step resources, caching and retries written in,
    the pipeline root as its default root, and the volume as its Kubernetes platform spec.
    Writes nothing."""
    from tfx import v1 as tfx

    pipeline = build_kubeflow_pipeline(config, trainer_tracking=trainer_tracking)
    runner = tfx.orchestration.experimental.KubeflowV2DagRunner(
        config=tfx.orchestration.experimental.KubeflowV2DagRunnerConfig(
            display_name=config.pipeline_name,
            default_image=config.kubeflow.image,
            default_commands=list(ENTRYPOINT),
            # Schema 2.1: each step reads its parameters from the executor input's
            # `parameterValues`, which the KFP backend fills; with 2.0, TFX's launcher reads
            # only the older `parameters` field and a step gets no execution properties.
            use_pipeline_spec_2_1=True,
        ),
    )
    job = runner.run(pipeline, write_out=False)
    resources = {
        component.id: step_resources(config, component) for component in pipeline.components
    }
    pipeline_spec = apply_step_settings(
        job["pipelineSpec"],
        resources=resources,
        images={name: image_for(config, step) for name, step in resources.items()},
        enable_cache=caching_enabled(config),
        beam_args=config.kubeflow.beam_args,
        beam_tasks={component.id for component in pipeline.components if uses_beam(component)},
        retries={"Trainer": config.kubeflow.trainer_retries},
    )
    # TFX puts the root in the PipelineJob's runtimeConfig; the IR carries it here, where KFP's
    # compiler writes a pipeline's root and the backend reads it when a run names none.
    pipeline_spec["defaultPipelineRoot"] = job["runtimeConfig"]["gcsOutputDirectory"]
    volume = config.kubeflow.volume
    platform_spec = (
        volume_platform_spec(
            pipeline_spec, claim_name=volume.claim_name, mount_path=volume.mount_path
        )
        if volume.claim_name
        else {}
    )
    return CompiledPipeline(pipeline_spec=pipeline_spec, platform_spec=platform_spec)


def volume_platform_spec(
    pipeline_spec: Mapping[str, Any], *, claim_name: str, mount_path: str
) -> dict[str, Any]:
    """KFP's Kubernetes platform spec that mounts the PVC `claim_name` at `mount_path` in every
    container executor, as `kfp.kubernetes.mount_pvc` writes it for a task."""
    from google.protobuf import json_format
    from kfp.kubernetes import kubernetes_executor_config_pb2 as k8s

    mount = k8s.PvcMount(mount_path=mount_path)
    mount.pvc_name_parameter.runtime_value.constant.string_value = claim_name
    mount.constant = claim_name  # the deprecated field, which `mount_pvc` still writes too
    executor = json_format.MessageToDict(k8s.KubernetesExecutorConfig(pvc_mount=[mount]))
    platform = pipeline_spec_pb2.PlatformSpec()
    executors = platform.platforms["kubernetes"].deployment_spec.executors
    for label, spec in pipeline_spec["deploymentSpec"]["executors"].items():
        if "container" in spec:  # an importer has no pod of its own
            executors[label].update(executor)
    return json_format.MessageToDict(platform)


def uses_beam(component: Any) -> bool:
    from tfx.dsl.components.base.executor_spec import BeamExecutorSpec

    return isinstance(getattr(component, "executor_spec", None), BeamExecutorSpec)


def step_of(component: Any) -> str:
    return (
        STEP_OF_COMPONENT.get(component.id)
        or STEP_OF_COMPONENT.get(type(component).__name__)
        or "default"
    )


def wants_accelerator(resources: StepResources) -> bool:
    return bool(resources.accelerator_type and resources.accelerator_count)


def image_for(config: Config, resources: StepResources) -> str:
    """The GPU-capable `kubeflow.image` for a container that asks for an accelerator; the
    smaller `kubeflow.cpu_image`, when set, for the others (the Dockerfile's two targets)."""
    kf = config.kubeflow
    if wants_accelerator(resources):
        return kf.image
    return kf.cpu_image or kf.image


def step_resources(config: Config, component: Any) -> StepResources:
    step = step_of(component)
    if step == "trainer" and config.kubeflow.tfjob.enabled:
        # The Trainer step only creates the TFJob and waits: the replicas get the GPUs.
        step = "default"
    return config.kubeflow.resources.for_step(step)


def write_compiled(compiled: CompiledPipeline, path: Path) -> None:
    """Writes the pipeline IR YAML with the KFP SDK's own writer, atomically: a failed write never
    leaves half a spec where a good one was."""
    from google.protobuf import json_format
    from kfp.compiler import pipeline_spec_builder

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.yaml")
    pipeline_spec_builder.write_pipeline_spec_to_file(
        pipeline_spec=json_format.ParseDict(
            compiled.pipeline_spec, pipeline_spec_pb2.PipelineSpec()
        ),
        pipeline_description=None,
        platform_spec=json_format.ParseDict(
            compiled.platform_spec, pipeline_spec_pb2.PlatformSpec()
        ),
        package_path=str(tmp),
    )
    tmp.replace(path)


# --- post-processing the compiled spec ------------------------------------------------------
def iter_tasks(
    spec: pipeline_spec_pb2.PipelineSpec,
) -> Iterator[tuple[str, pipeline_spec_pb2.PipelineTaskSpec]]:
    """Every task of the pipeline, including those inside condition sub-DAGs (the Pusher)."""
    pending = [spec.root.dag]
    while pending:
        dag = pending.pop()
        for name, task in dag.tasks.items():
            yield name, task
            component = spec.components.get(task.component_ref.name)
            if component is not None and component.HasField("dag"):
                pending.append(component.dag)


def executor_label_of(
    spec: pipeline_spec_pb2.PipelineSpec, task: pipeline_spec_pb2.PipelineTaskSpec
) -> str | None:
    component = spec.components.get(task.component_ref.name)
    return component.executor_label if component is not None and component.executor_label else None


def _cpu_number(quantity: str) -> float:
    return float(parse_quantity(quantity))


def _memory_gb(quantity: str) -> float:
    """In GB (10^9 bytes), the unit of the deprecated numeric fields (as KFP's compiler does)."""
    return float(parse_quantity(quantity)) / 1e9


def resource_spec(resources: StepResources) -> ContainerSpec.ResourceSpec:
    """KFP's ResourceSpec for one container: the string fields (read by KFP >= 2.3) and the
    deprecated numeric ones (read by older backends), as `kfp.compiler` writes them."""
    spec = ContainerSpec.ResourceSpec()
    if resources.cpu_request:
        spec.resource_cpu_request = resources.cpu_request
        spec.cpu_request = _cpu_number(resources.cpu_request)
    if resources.cpu_limit:
        spec.resource_cpu_limit = resources.cpu_limit
        spec.cpu_limit = _cpu_number(resources.cpu_limit)
    if resources.memory_request:
        spec.resource_memory_request = resources.memory_request
        spec.memory_request = _memory_gb(resources.memory_request)
    if resources.memory_limit:
        spec.resource_memory_limit = resources.memory_limit
        spec.memory_limit = _memory_gb(resources.memory_limit)
    if resources.accelerator_type and resources.accelerator_count:
        spec.accelerator.type = resources.accelerator_type
        spec.accelerator.count = resources.accelerator_count
        spec.accelerator.resource_type = resources.accelerator_type
        spec.accelerator.resource_count = str(resources.accelerator_count)
    return spec


def apply_step_settings(
    pipeline_spec: Mapping[str, Any],
    *,
    resources: Mapping[str, StepResources],
    enable_cache: bool,
    images: Mapping[str, str] | None = None,
    beam_args: Sequence[str] = (),
    beam_tasks: Collection[str] = (),
    retries: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Returns the spec with each task's container `resources` replaced by `resources[task]`
    (and its image by `images[task]`, when given), every task's caching flag set explicitly,
    the Beam args (which TFX appends to every step) kept only on the steps in `beam_tasks`, and
    a KFP retry policy of `retries[task]` retries on those tasks (a preempted Trainer pod is run
    again and resumes from its checkpoint). Refuses a task it has no resources for."""
    from google.protobuf import json_format

    spec = json_format.ParseDict(pipeline_spec, pipeline_spec_pb2.PipelineSpec())
    deployment = json_format.ParseDict(
        json_format.MessageToDict(spec.deployment_spec),
        pipeline_spec_pb2.PipelineDeploymentConfig(),
    )
    for name, task in iter_tasks(spec):
        label = executor_label_of(spec, task)
        if label is None:
            continue  # a sub-DAG (the Pusher's condition), not a container
        task.caching_options.enable_cache = enable_cache
        if retries and retries.get(name):
            task.retry_policy.max_retry_count = int(retries[name])
        executor = deployment.executors[label]
        if not executor.HasField("container"):
            continue  # an importer: no pod of its own
        if name not in resources:
            raise ConfigError(
                f"no resources known for Kubeflow step {name!r}; add it to STEP_OF_COMPONENT"
            )
        executor.container.resources.CopyFrom(resource_spec(resources[name]))
        if images is not None:
            executor.container.image = images[name]
        if beam_args and name not in beam_tasks:
            _drop_suffix(executor.container.args, beam_args)
            if executor.container.HasField("lifecycle"):
                _drop_suffix(executor.container.lifecycle.pre_cache_check.args, beam_args)
    spec.deployment_spec.Clear()
    spec.deployment_spec.update(json_format.MessageToDict(deployment))
    return json_format.MessageToDict(spec)


def _drop_suffix(args: Any, suffix: Sequence[str]) -> None:
    if len(args) >= len(suffix) and list(args[-len(suffix) :]) == list(suffix):
        del args[-len(suffix) :]
