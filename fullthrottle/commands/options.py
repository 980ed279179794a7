"""Command-line options shared by the commands that read a run's config."""

from __future__ import annotations

import argparse
import json

from fullthrottle.core.config import PRESETS, Config, load_config


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="a YAML config (see `fullthrottle init`)")
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), help="hardware preset applied before the file"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override one config field, e.g. training.train_steps=200 (repeatable)",
    )
    parser.add_argument(
        "--output-dir", help="where runs, metadata and pushed models go (default: runs/)"
    )
    parser.add_argument("--data", metavar="PATH", help="shorthand for --set data.path=PATH")


def config_from_args(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={json.dumps(args.output_dir)}")
    if args.data:
        overrides.append(f"data.path={json.dumps(args.data)}")
    return load_config(args.config, preset=args.preset, overrides=overrides)
