"""The `fullthrottle` command line.

Each subcommand lives in `fullthrottle.commands.<name>` with `register(subparsers)` and a
`run(args) -> int`. Errors derived from `FullthrottleError` are printed as one paragraph for
people and exit with status 2; `--debug` shows the stack trace instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from collections.abc import Sequence

from fullthrottle.errors import USER_ERRORS

# Modules under fullthrottle.commands, in the order `--help` lists them.
COMMANDS = ("run", "init", "schema", "doctor", "compare", "ui", "compile", "submit", "serve", "predict", "deploy_kit", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fullthrottle",
        description="A TFX pipeline with a fast distributed Trainer.",
        epilog="Example: fullthrottle run    (the whole pipeline on the bundled penguins data)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show stack traces on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"fullthrottle.commands.{name}")
        command_parser = module.register(sub)
        command_parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                    help="show stack traces on errors")
        command_parser.set_defaults(handler=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    try:
        return int(args.handler(args) or 0)
    except USER_ERRORS as exc:
        if debug:
            raise
        message = textwrap.fill(str(exc), width=100, break_long_words=False, break_on_hyphens=False)
        print(f"fullthrottle {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fullthrottle {args.command}: interrupted", file=sys.stderr)
        return 130
