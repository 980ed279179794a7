"""`fullthrottle compare`: tracked runs side by side (differing params, key results, a chart)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fullthrottle.commands.options import add_config_arguments, config_from_args
from fullthrottle.core import exit_status
from fullthrottle.core.errors import ConfigError


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "compare",
        help="compare tracked runs: differing params, accuracy, loss, speed; writes a chart",
        description=(
            "Reads pipeline runs from the MLflow store the config points at (by default the SQLite "
            "store under <output_dir>/mlflow) and prints the params that differ and the key "
            "results. Writes a PNG with the loss curves and throughput side by side."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle compare                 # the two newest runs under runs/\n"
            "  fullthrottle compare --last 5 --chart /tmp/runs.png\n"
            "  fullthrottle compare 3f2a... 9c1b... --tracking-uri http://127.0.0.1:5000"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "run_ids", nargs="*", metavar="RUN_ID", help="MLflow run ids (default: the newest runs)"
    )
    parser.add_argument(
        "--last", type=int, default=2, metavar="N", help="compare the N newest runs (default 2)"
    )
    parser.add_argument(
        "--tracking-uri", help="the MLflow store (default: from the config, see docs/tracking.md)"
    )
    parser.add_argument(
        "--experiment", help="experiment name (default: tracking.experiment or the pipeline name)"
    )
    parser.add_argument(
        "--chart", metavar="PNG", help="chart file (default: <output_dir>/compare.png)"
    )
    add_config_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from mlflow.tracking import MlflowClient

    from fullthrottle.tracking.compare import chart, find_runs, table
    from fullthrottle.tracking.store import resolve_destination

    if args.last < 1:
        raise ConfigError(f"`--last` must be >= 1, got {args.last}")
    config = config_from_args(args)
    uri = args.tracking_uri or resolve_destination(config).uri
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise ConfigError(
            f"there is no tracking store at {uri.removeprefix('sqlite:///')}; run `fullthrottle run` first or "
            "pass --output-dir / --tracking-uri"
        )
    client = MlflowClient(tracking_uri=uri)
    experiment = args.experiment or config.tracking.experiment or config.pipeline_name
    runs = find_runs(client, experiment=experiment, run_ids=list(args.run_ids), last=args.last)
    print(table(runs))
    path = chart(runs, Path(args.chart) if args.chart else config.output_path / "compare.png")
    print(f"chart: {path}", file=sys.stderr)
    return exit_status.SUCCESS
