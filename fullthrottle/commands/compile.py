"""`fullthrottle compile --target kubeflow`: the pipeline as KFP v2 pipeline IR YAML."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fullthrottle.commands.options import add_config_arguments, config_from_args
from fullthrottle.core import exit_status
from fullthrottle.core.errors import ConfigError

TARGETS = ("kubeflow",)
DEFAULT_OUTPUT = "fullthrottle-kubeflow.yaml"


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "compile",
        help="compile the pipeline for Kubeflow Pipelines v2 (pipeline IR YAML)",
        description=(
            "Builds the same pipeline as `fullthrottle run` with the paths the pods see "
            "(kubeflow.pipeline_root, kubeflow.input_base, kubeflow.serving_dir), the image "
            "(kubeflow.image), Beam args for the data components (kubeflow.beam_args), per-step "
            "resources (kubeflow.resources) and, with kubeflow.tfjob.enabled, the Trainer as a "
            "multi-worker TFJob, and the volume of the roots (kubeflow.volume, a PVC); writes the "
            "pipeline IR YAML that the KFP UI, kfp.Client and `fullthrottle submit` upload. With "
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
            "  fullthrottle compile --target kubeflow --preset gpu      # the Trainer asks for a GPU\n"
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
    if output.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError(
            f"--output {output}: the compiled pipeline is KFP's pipeline IR YAML (what the KFP UI "
            f"and kfp.Client upload); name the file .yaml, e.g. {output.with_suffix('.yaml')}"
        )

    from fullthrottle.core.redact import redact_text
    from fullthrottle.tracking import remote_trainer_link
    from pipelines.kubeflow_v2_runner import (
        caching_enabled,
        compile_pipeline,
        kubeflow_paths,
        wants_accelerator,
        write_compiled,
    )

    paths = kubeflow_paths(config)
    link = remote_trainer_link(config, pipeline_root=paths["pipeline_root"])
    compiled = compile_pipeline(config, trainer_tracking=link)
    write_compiled(compiled, output)
    tasks = sorted(_task_names(compiled.pipeline_spec))
    volume = config.kubeflow.volume
    trainer = config.kubeflow.resources.for_step("trainer")
    print(
        "\n".join(
            [
                f"fullthrottle: compiled {config.pipeline_name!r} for Kubeflow Pipelines v2 -> {output}",
                f"  image:         {config.kubeflow.image} (steps with a GPU)",
                f"  cpu image:     {config.kubeflow.cpu_image or config.kubeflow.image} (steps without)",
                f"  pipeline root: {paths['pipeline_root']}",
                f"  input base:    {paths['input_base']}"
                + (
                    " (put the train/ and eval/ folders `fullthrottle run` stages there)"
                    if config.data.format in ("csv", "parquet")
                    else ""
                ),
                f"  serving dir:   {paths['serving_dir']}",
                "  volume:        "
                + (
                    f"PVC {volume.claim_name!r} at {volume.mount_path} in every step"
                    if volume.claim_name
                    else "none"
                ),
                "  trainer GPUs:  "
                + (
                    f"{trainer.accelerator_count} {trainer.accelerator_type}"
                    if wants_accelerator(trainer)
                    else "none (--preset gpu or kubeflow.resources.trainer.accelerator_count asks)"
                ),
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
