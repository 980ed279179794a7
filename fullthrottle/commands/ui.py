"""`fullthrottle ui`: the MLflow UI on this project's tracking store, on 127.0.0.1 only."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

from fullthrottle.commands.options import add_config_arguments, config_from_args
from fullthrottle.core.errors import ConfigError


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "ui",
        help="open the MLflow UI on the run's tracking store (127.0.0.1)",
        description=(
            "Starts `mlflow ui` on the store `fullthrottle run` tracks into (default: the SQLite "
            "store under <output_dir>/mlflow), bound to 127.0.0.1. Stop it with Ctrl-C. A remote "
            "tracking server has its own UI: open its address instead."
        ),
        epilog="Examples:\n  fullthrottle ui\n  fullthrottle ui --output-dir /data/runs --port 5001",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1 (default 5000)")
    add_config_arguments(parser)
    return parser


def ui_command(config: Any, port: int) -> list[str]:
    """The `mlflow ui` command line for the config's store; refuses remote stores."""
    from fullthrottle.tracking.store import resolve_destination

    destination = resolve_destination(config)
    if destination.is_remote:
        raise ConfigError(
            f"the tracking store is a server ({destination.uri}); open that address in a browser instead of `fullthrottle ui`"
        )
    if destination.embedded and not os.path.exists(destination.uri.removeprefix("sqlite:///")):
        raise ConfigError(
            f"there is no tracking store at {destination.uri.removeprefix('sqlite:///')} yet; run "
            "`fullthrottle run` first, or pass the run's --output-dir"
        )
    if not 0 < port < 65536:
        raise ConfigError(f"`--port` must be a TCP port in 1..65535, got {port}")
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", destination.uri,
               "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    if destination.artifact_root:
        command += ["--default-artifact-root", destination.artifact_root]
    return command


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    command = ui_command(config, args.port)
    print(f"fullthrottle ui: http://127.0.0.1:{args.port} (Ctrl-C stops it)", file=sys.stderr)
    return subprocess.call(command)
