"""A compiled KFP v2 pipeline run as local processes, the way the KFP backend would run its tasks.

For each task of the spec, in the order its `dependentTasks` give: the executor input KFP's
driver builds (`parameterValues` from the task's constants, input artifacts as the producers'
executor outputs returned them, output artifacts under `<pipeline root>/<run id>/<task>/` with an
`outputFile`), the `{{$}}` placeholder resolved by KFP's own code (`kfp.local.placeholder_utils`),
then the container's `lifecycle.preCacheCheck` command (ExampleGen's driver) and its command and
arguments exactly as the spec writes them, each as a local process. A task with a trigger
condition runs only when the condition holds.

What this is not: the KFP backend (its driver, launcher, caching, MLMD), pods, images or volumes
(tests/host/check_image.sh runs a root task's commands from here inside the built image).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from kfp.local import placeholder_utils
from kfp.pipeline_spec import pipeline_spec_pb2

# The form TFX compiles a conditional node's trigger into (the Pusher's "blessed" check).
_CONDITION = re.compile(
    r"^\(?inputs\.artifacts\['_(?P<task>[^.']+)\.(?P<key>[^']+)'\]\.artifacts\[0\]"
    r"\.metadata\['(?P<field>[^']+)'\] == (?P<value>[-\d.]+)\)?$"
)


@dataclass
class TaskRun:
    name: str
    ran: bool
    commands: list[list[str]] = field(default_factory=list)  # what was executed, in order
    outputs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # RuntimeArtifacts
    seconds: float = 0.0


def _order(tasks: dict[str, Any]) -> list[str]:
    done: list[str] = []
    pending = dict(tasks)
    while pending:
        ready = sorted(n for n, t in pending.items() if set(t.dependent_tasks) <= set(done))
        if not ready:
            raise ValueError(f"the spec's dependencies have a cycle among {sorted(pending)}")
        for name in ready:
            done.append(name)
            del pending[name]
    return done


def _condition_holds(condition: str, runs: dict[str, TaskRun]) -> bool:
    match = _CONDITION.match(condition.strip())
    if match is None:
        raise ValueError(f"a trigger condition this runner cannot evaluate: {condition!r}")
    artifacts = runs[match["task"]].outputs.get(match["key"]) or []
    value = artifacts[0].get("metadata", {}).get(match["field"]) if artifacts else None
    return value is not None and float(value) == float(match["value"])


def task_commands(
    pipeline_spec: dict[str, Any],
    name: str,
    *,
    pipeline_root: str,
    run_id: str,
    upstream: dict[str, TaskRun] | None = None,
) -> tuple[list[list[str]], pipeline_spec_pb2.ExecutorInput]:
    """The commands KFP runs for task `name` (its `lifecycle.preCacheCheck`, if any, then its
    container's command and args), placeholders resolved against the executor input KFP's driver
    builds, and that executor input. `upstream`: the runs of the tasks it reads artifacts from."""
    spec = json_format.ParseDict(pipeline_spec, pipeline_spec_pb2.PipelineSpec())
    task = spec.root.dag.tasks[name]
    component = spec.components[task.component_ref.name]
    container = pipeline_spec["deploymentSpec"]["executors"][component.executor_label]["container"]
    task_root = f"{pipeline_root}/{run_id}/{name}"
    executor_input = pipeline_spec_pb2.ExecutorInput()
    for key, parameter in task.inputs.parameters.items():
        if not parameter.HasField("runtime_value"):
            raise ValueError(f"{name}.{key}: only constant parameters are run here")
        executor_input.inputs.parameter_values[key].CopyFrom(parameter.runtime_value.constant)
    for key, argument in task.inputs.artifacts.items():
        producer = argument.task_output_artifact
        for artifact in (upstream or {})[producer.producer_task].outputs[
            producer.output_artifact_key
        ]:
            json_format.ParseDict(artifact, executor_input.inputs.artifacts[key].artifacts.add())
    for key, definition in component.output_definitions.artifacts.items():
        executor_input.outputs.artifacts[key].artifacts.add(
            name=f"{run_id}.{name}.{key}", type=definition.artifact_type, uri=f"{task_root}/{key}"
        )
    executor_input.outputs.output_file = f"{task_root}/executor_output.json"
    executor_input_dict = json_format.MessageToDict(executor_input)
    commands = []
    hook = container.get("lifecycle", {}).get("preCacheCheck")
    if hook:
        commands.append([*hook["command"], *hook["args"]])
    commands.append([*container["command"], *container["args"]])
    resolved = [
        placeholder_utils.replace_placeholders(
            command,
            executor_input_dict,
            pipeline_resource_name=spec.pipeline_info.name,
            task_resource_name=name,
            pipeline_root=pipeline_root,
            unique_pipeline_id=run_id,
        )
        for command in commands
    ]
    return resolved, executor_input


def read_outputs(executor_input: pipeline_spec_pb2.ExecutorInput) -> dict[str, list[dict]]:
    """The task's output artifacts as the spec declares them, with what its executor returned
    (metadata, properties) in `outputFile`."""
    declared = {
        key: [json_format.MessageToDict(a) for a in artifacts.artifacts]
        for key, artifacts in executor_input.outputs.artifacts.items()
    }
    returned = json.loads(Path(executor_input.outputs.output_file).read_text())
    for key, artifacts in returned.get("artifacts", {}).items():
        # The executor returns what it learnt (metadata, properties); type from the spec.
        for mine, theirs in zip(declared[key], artifacts.get("artifacts", []), strict=False):
            mine.update({k: v for k, v in theirs.items() if k != "type"})
    return declared


def run_spec(
    pipeline_spec: dict[str, Any], *, pipeline_root: str, env: dict[str, str], log_dir: Path
) -> dict[str, TaskRun]:
    """Runs every task of the compiled pipeline as local processes; returns each task's run.
    Raises with the task's log when a process fails."""
    import time

    spec = json_format.ParseDict(pipeline_spec, pipeline_spec_pb2.PipelineSpec())
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    log_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, TaskRun] = {}
    tasks = dict(spec.root.dag.tasks)
    for name in _order(tasks):
        task = tasks[name]
        run = runs[name] = TaskRun(name=name, ran=False)
        if task.trigger_policy.condition and not _condition_holds(
            task.trigger_policy.condition, runs
        ):
            continue
        commands, executor_input = task_commands(
            pipeline_spec, name, pipeline_root=pipeline_root, run_id=run_id, upstream=runs
        )
        task_root = Path(executor_input.outputs.output_file).parent
        task_root.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        for number, command in enumerate(commands):
            log = log_dir / f"{name}-{number}.log"
            with open(log, "w") as out:
                done = subprocess.run(
                    command, env=env, cwd=task_root, stdout=out, stderr=subprocess.STDOUT
                )
            run.commands.append(command)
            if done.returncode != 0:
                raise AssertionError(
                    f"task {name} failed ({' '.join(command[:3])}...):\n{log.read_text()[-6000:]}"
                )
        run.ran, run.seconds = True, time.monotonic() - started
        run.outputs = read_outputs(executor_input)
    return runs


def local_env(repo: Path, tmp: Path) -> dict[str, str]:
    """The processes' environment: this project on the path (the image installs it), a temp
    folder of their own, and no MLFLOW_TRACKING_URI (the Trainer's link comes from the spec)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = str(repo)
    env["TMPDIR"] = str(tmp)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def main(argv: list[str]) -> int:
    """`python -m tests.kfp_local SPEC TASK RUN_ID`: prints, as JSON, the commands KFP would run
    for a root task (one with no upstream artifacts) of the compiled IR YAML SPEC, and where its
    executor writes `outputFile`; for running them elsewhere (tests/host/check_image.sh runs them
    inside the image)."""
    import yaml

    spec_path, name, run_id = argv
    pipeline_spec = next(yaml.safe_load_all(Path(spec_path).read_text()))
    commands, executor_input = task_commands(
        pipeline_spec, name, pipeline_root=pipeline_spec["defaultPipelineRoot"], run_id=run_id
    )
    print(json.dumps({"commands": commands, "output_file": executor_input.outputs.output_file}))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
