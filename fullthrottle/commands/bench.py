"""`fullthrottle bench`: the benchmark suite (see docs/performance.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fullthrottle.core import exit_status
from fullthrottle.core.errors import ConfigError


def register(sub: Any) -> argparse.ArgumentParser:
    from fullthrottle.bench.suite import BENCHMARKS

    parser = sub.add_parser(
        "bench",
        help="benchmark the Trainer against the TFX-example trainer and the machine's limits",
        description=(
            "Measures, alternating the contenders window by window: our Trainer vs a TFX-example "
            "`model.fit` trainer (Transformer and tabular), model FLOPs utilization against a "
            "measured matmul ceiling, input efficiency, our reader vs tfx_bsl, MLflow tracking "
            "overhead, Beam ExampleGen+Transform scaling, per-component pipeline time and the "
            "serving benchmark. Writes <results-dir>/<timestamp>.json and .md, merges the run's "
            "readings into <results-dir>/LATEST.json and LATEST.md (and, for the repo's "
            "bench/results, the table in docs/performance.md) and prints the table."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle bench --quick            (under 5 minutes on 2 cores)\n"
            "  fullthrottle bench                    (full sizes: Beam up to 1M rows; long)\n"
            "  fullthrottle bench --quick --only trainer --only tracking"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    parser.add_argument(
        "--only",
        action="append",
        choices=BENCHMARKS,
        default=[],
        metavar="NAME",
        help=f"run only these benchmarks (repeatable): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--results-dir", default="bench/results", help="where results go (default: bench/results)"
    )
    parser.add_argument(
        "--work-dir", help="scratch folder for runs and data (default: a new temp folder)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    from fullthrottle.bench.suite import (
        BENCHMARKS,
        DOCS_PAGE,
        FULL,
        LATEST,
        QUICK,
        REPO,
        embed_latest,
        markdown_table,
        run_suite,
        write_results,
    )

    results_dir = Path(args.results_dir)
    if results_dir.exists() and not results_dir.is_dir():
        raise ConfigError(
            f"--results-dir {results_dir} exists and is not a folder; pass a folder path"
        )
    if args.work_dir and Path(args.work_dir).exists() and any(Path(args.work_dir).iterdir()):
        raise ConfigError(
            f"--work-dir {args.work_dir} is not empty; the suite writes fresh pipeline runs there. "
            "Pass an empty or new folder (or omit it for a temporary one)."
        )
    document = run_suite(
        sizes=QUICK if args.quick else FULL,
        mode="quick" if args.quick else "full",
        work_dir=Path(args.work_dir) if args.work_dir else None,
        only=tuple(args.only) or BENCHMARKS,
    )
    json_path, md_path = write_results(document, results_dir)
    print(markdown_table(document))
    print(f"results: {json_path} and {md_path}")
    latest = results_dir / f"{LATEST}.md"
    print(f"latest reading of each benchmark: {latest}")
    # The docs show the repo's latest results; a run written elsewhere leaves them alone.
    if results_dir.resolve() == (REPO / "bench" / "results").resolve() and DOCS_PAGE.exists():
        page = DOCS_PAGE.read_text(encoding="utf-8")
        DOCS_PAGE.write_text(
            embed_latest(page, latest.read_text(encoding="utf-8")), encoding="utf-8"
        )
        print(f"updated the latest results in {DOCS_PAGE}")
    failed = [name for name, part in document["results"].items() if "error" in part]
    if failed and document["work_dir"]:
        print(f"work folder (runs, data, logs of the failed benchmarks): {document['work_dir']}")
    return exit_status.FINDINGS if failed else exit_status.SUCCESS
