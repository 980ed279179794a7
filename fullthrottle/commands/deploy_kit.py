"""`fullthrottle deploy-kit`: write the TF Serving / Kubernetes / KServe files for a config."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fullthrottle.commands.options import add_config_arguments, config_from_args
from fullthrottle.core import exit_status


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "deploy-kit",
        help="write models.config, batching.config, a compose file, Kubernetes and KServe manifests",
        description=(
            "Generates the deploy kit from the config, so the model name, push folder and ports agree "
            "with `fullthrottle run` and `fullthrottle serve`. serving/deploy/ holds the default config's kit."
        ),
        epilog="Examples:\n  fullthrottle deploy-kit --kit-dir deploy\n  fullthrottle deploy-kit --config my.yaml --kit-dir deploy",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--kit-dir", default="deploy", help="folder to write the kit into (default: deploy/)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    from serving.deploy_kit import write_kit

    config = config_from_args(args)
    for path in write_kit(config, kit_dir=Path(args.kit_dir), project_root=Path.cwd()):
        print(path)
    return exit_status.SUCCESS
