"""`fullthrottle tensorboard`: TensorBoard on the Trainer's logs of a run folder, on 127.0.0.1 only."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from fullthrottle.commands.options import add_config_arguments, config_from_args
from fullthrottle.core.errors import ConfigError

DEFAULT_PORT = 6006


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "tensorboard",
        help="open TensorBoard on the Trainer's logs of the run folder (127.0.0.1)",
        description=(
            "Starts TensorBoard on <output_dir>/pipeline_root/<pipeline>/Trainer/model_run: one "
            "TensorBoard run per Trainer execution (train/* per loop, eval/* at the end, and the "
            "profiler trace when training.profile_steps captured one), bound to 127.0.0.1. Stop "
            "it with Ctrl-C."
        ),
        epilog=(
            "Examples:\n  fullthrottle tensorboard\n"
            "  fullthrottle tensorboard --output-dir /data/runs --port 6007"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port on 127.0.0.1 (default {DEFAULT_PORT})"
    )
    add_config_arguments(parser)
    return parser


def log_dir(config: Any) -> Path:
    """Where the Trainer's executions keep their TensorBoard logs (`model_run/<execution>/logs`)."""
    return config.pipeline_root / "Trainer" / "model_run"


def tensorboard_command(config: Any, port: int) -> list[str]:
    """The `tensorboard` command line for the config's run folder; refuses a folder without logs."""
    logs = log_dir(config)
    if not logs.is_dir():
        raise ConfigError(
            f"there are no Trainer logs at {logs} yet; run `fullthrottle run` first, or pass the "
            "run's --output-dir"
        )
    if not 0 < port < 65536:
        raise ConfigError(f"`--port` must be a TCP port in 1..65535, got {port}")
    return [sys.executable, "-m", "tensorboard.main", "--logdir", str(logs),
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    command = tensorboard_command(config, args.port)
    print(
        f"fullthrottle tensorboard: http://127.0.0.1:{args.port} (Ctrl-C stops it)", file=sys.stderr
    )
    return subprocess.call(command)
