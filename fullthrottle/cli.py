"""The `fullthrottle` command line.

Each subcommand lives in `fullthrottle.commands.<name>` with `register(subparsers)` and a
`run(args) -> int`. Errors meant for people (`fullthrottle.core.errors.USER_ERRORS`: ours and
the training library's, `ConfigError` among them) are printed as one paragraph and exit with
status 2 (`fullthrottle.core.exit_status`); `--debug` shows the stack trace too.

TensorFlow's C++ code logs to the process's stderr: lines while it loads (oneDNN), and errors
that are not ours to report (`failed call to cuInit` on a machine without a GPU). The command
line shows them only with `--verbose`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import textwrap
import traceback
from collections.abc import Sequence

# Modules under fullthrottle.commands, in the order `--help` lists them.
COMMANDS = (
    "run",
    "init",
    "schema",
    "doctor",
    "compare",
    "ui",
    "tensorboard",
    "serve",
    "predict",
    "deploy_kit",
    "compile",
    "submit",
    "bench",
    "gpu_check",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fullthrottle",
        description="A TFX pipeline with a fast distributed Trainer.",
        epilog="Example: fullthrottle run    (the whole pipeline on the bundled penguins data)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--debug", action="store_true", help="show stack traces on errors (implies --verbose)"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show TensorFlow, TFX, Beam and MLflow log messages"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"fullthrottle.commands.{name}")
        command_parser = module.register(sub)
        command_parser.add_argument(
            "--debug",
            action="store_true",
            default=argparse.SUPPRESS,
            help="show stack traces on errors",
        )
        command_parser.add_argument(
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="show third-party log messages",
        )
        command_parser.set_defaults(handler=module.run)
    return parser


def quiet_third_party_logs(*, verbose: bool) -> None:
    """TensorFlow, TFX (absl), Beam and MLflow log dozens of INFO/WARNING lines per run that
    say nothing actionable to a user (ZetaSQL fallbacks, deprecations inside TFMA, table
    initialisation notes, oneDNN, cuInit on a machine without a GPU). Show none of them unless
    `--verbose`. Loads TensorFlow: its C++ log level is read once, from the environment, when it
    loads, and a few of its lines come before that level applies."""
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # MLflow resets its logger at import
    for name in ("absl", "tensorflow", "apache_beam", "mlflow", "alembic", "py.warnings"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # absl comes with TensorFlow; without it there is nothing to quiet
        pass
    # Python warnings from third-party packages (deprecations) go to the quieted logger.
    logging.captureWarnings(True)
    from fullthrottle.core.native_logs import load_notes_dropped

    with load_notes_dropped():
        import tensorflow  # noqa: F401 - loaded here, with its load-time notes dropped


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_third_party_logs(verbose="--verbose" in argv or "--debug" in argv)
    # Imported only now: the training library's error types import TensorFlow.
    from fullthrottle.core import exit_status
    from fullthrottle.core.errors import USER_ERRORS

    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = tuple(argv)  # what `run` shows as the command that resumes it
    debug = getattr(args, "debug", False)
    try:
        return int(args.handler(args) or 0)
    except USER_ERRORS as exc:
        if debug:
            traceback.print_exc()
        message = textwrap.fill(str(exc), width=100, break_long_words=False, break_on_hyphens=False)
        print(f"fullthrottle {args.command}: error: {message}", file=sys.stderr)
        return exit_status.USER_ERROR
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM where a command turns it into one
        signum = getattr(exc, "signum", None) or signal.SIGINT
        print(
            f"fullthrottle {args.command}: interrupted by {signal.Signals(signum).name}",
            file=sys.stderr,
        )
        return exit_status.interrupted(signum)
