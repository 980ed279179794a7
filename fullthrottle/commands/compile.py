"""`fullthrottle compile --target kubeflow`: the pipeline as a KFP v2 pipeline spec (JSON)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fullthrottle.commands.options import add_config_arguments, config_from_args
from fullthrottle.core import exit_status
from fullthrottle.core.errors import ConfigError

TARGETS = ("kubeflow",)
DEFAULT_OUTPUT = "fullthrottle-kubeflow.json"


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "compile",
        help="compile the pipeline for Kubeflow Pipelines v2 (a pipeline-spec JSON)",
        description=(
            "Builds the same pipeline as `fullthrottle run` with the paths the pods see "
            "(kubeflow.pipeline_root, kubeflow.input_base, kubeflow.serving_dir), the image "
            "(kubeflow.image), Beam args for the data components (kubeflow.beam_args), per-step "
            "resources (kubeflow.resources) and, with kubeflow.tfjob.enabled, the Trainer as a "
            "multi-worker TFJob; writes a KFP PipelineJob JSON for `fullthrottle submit`. With "
            "tracking.uri or MLFLOW_TRACKING_URI set to a tracking server, the Trainer tracks "
            "into it from the pod. "
            "Contacts nothing: object-store paths are written as given."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle compile --target kubeflow --image registry.example.com/fullthrottle:0.1.0\n"
            "  fullthrottle compile --target kubeflow --image registry.example.com/fullthrottle:0.1.0 "
            "--cpu-image registry.example.com/fullthrottle:0.1.0-cpu\n"
            "  fullthrottle compile --target kubeflow --pipeline-root gs://bucket/root --no-cache\n"
            "  fullthrottle compile --target kubeflow --preset multi_worker --set kubeflow.tfjob.enabled=true\n"
            "See docs/kubeflow.md."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--target", choices=TARGETS, default="kubeflow", help="orchestrator (default: kubeflow)"
    )
    parser.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        default=DEFAULT_OUTPUT,
        help=f"where to write the spec (default: {DEFAULT_OUTPUT})",
    )
    parser.add_argument(
        "--image",
        help="shorthand for --set kubeflow.image=IMAGE: the GPU-capable image (Dockerfile target gpu)",
    )
    parser.add_argument(
        "--cpu-image",
        help="shorthand for --set kubeflow.cpu_image=IMAGE: the image of steps without a GPU "
        "(Dockerfile target cpu; default: --image)",
    )
    parser.add_argument("--pipeline-root", help="shorthand for --set kubeflow.pipeline_root=URI")
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument(
        "--cache", dest="cache", action="store_true", default=None, help="enable KFP step caching"
    )
    cache.add_argument(
        "--no-cache", dest="cache", action="store_false", help="disable KFP step caching"
    )
    add_config_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.image:
        args.overrides.append(f"kubeflow.image={json.dumps(args.image)}")
    if args.cpu_image:
        args.overrides.append(f"kubeflow.cpu_image={json.dumps(args.cpu_image)}")
    if args.pipeline_root:
        args.overrides.append(f"kubeflow.pipeline_root={json.dumps(args.pipeline_root)}")
    if args.cache is not None:
        args.overrides.append(f"kubeflow.enable_cache={'true' if args.cache else 'false'}")
    config = config_from_args(args)  # every config error surfaces here, before TFX is imported
    output = Path(args.output)
    if output.exists() and output.is_dir():
        raise ConfigError(
            f"--output {output} is a folder; give a file name such as {output / DEFAULT_OUTPUT}"
        )

    from fullthrottle.core.redact import redact_text
    from fullthrottle.tracking import remote_trainer_link
    from pipelines.kubeflow_v2_runner import (
        caching_enabled,
        compile_pipeline,
        kubeflow_paths,
        write_compiled,
    )

    paths = kubeflow_paths(config)
    link = remote_trainer_link(config, pipeline_root=paths["pipeline_root"])
    job = compile_pipeline(config, trainer_tracking=link)
    write_compiled(job, output)
    tasks = sorted(_task_names(job["pipelineSpec"]))
    print(
        "\n".join(
            [
                f"fullthrottle: compiled {config.pipeline_name!r} for Kubeflow Pipelines v2 -> {output}",
                f"  image:         {config.kubeflow.image} (steps with a GPU)",
                f"  cpu image:     {config.kubeflow.cpu_image or config.kubeflow.image} (steps without)",
                f"  pipeline root: {paths['pipeline_root']}",
                f"  input base:    {paths['input_base']}",
                f"  serving dir:   {paths['serving_dir']}",
                f"  beam args:     {' '.join(config.kubeflow.beam_args) or '(none)'}",
                f"  caching:       {'on' if caching_enabled(config) else 'off'}",
                "  trainer:       "
                + (
                    f"TFJob with {config.kubeflow.tfjob.workers} workers (chief included)"
                    if config.kubeflow.tfjob.enabled
                    else "one pod"
                ),
                "  tracking:      "
                + (
                    f"the Trainer tracks into {redact_text(link['uri'])}, experiment "
                    f"{link['experiment']!r}"
                    if link
                    else "off (set tracking.uri or MLFLOW_TRACKING_URI to a server the pods reach)"
                ),
                f"  steps:         {', '.join(tasks)}",
                f"next: fullthrottle submit {output} --endpoint http://<kfp-host>",
            ]
        )
    )
    return exit_status.SUCCESS


def _task_names(pipeline_spec: dict[str, Any]) -> list[str]:
    names = []
    pending = [pipeline_spec["root"]["dag"]]
    while pending:
        dag = pending.pop()
        for name, task in dag.get("tasks", {}).items():
            component = pipeline_spec["components"].get(task["componentRef"]["name"], {})
            if "dag" in component:
                pending.append(component["dag"])
            else:
                names.append(name)
    return names
