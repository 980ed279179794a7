"""`fullthrottle bench`: the benchmark suite (see docs/performance.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fullthrottle.core import exit_status
from fullthrottle.core.errors import ConfigError


def register(sub: Any) -> argparse.ArgumentParser:
    from fullthrottle.bench.benchmarks import BENCHMARKS

    listing = "\n".join(f"  {name:<12} {spec.summary}" for name, spec in BENCHMARKS.items())
    parser = sub.add_parser(
        "bench",
        help="benchmark the Trainer against the TFX-example trainer and the machine's limits",
        description=(
            "Measures, alternating the contenders window by window, each benchmark of the "
            "suite:\n" + listing + "\n\nWrites <results-dir>/<timestamp>.json and .md, merges "
            "the run's readings into <results-dir>/LATEST.json and LATEST.md (and, for the "
            "repo's bench/results, the generated blocks of the docs) and prints the table."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle bench --quick            (under 5 minutes on 2 cores)\n"
            "  fullthrottle bench                    (full sizes: Beam up to 1M rows; long)\n"
            "  fullthrottle bench --quick --only trainer --only tracking\n"
            "  fullthrottle bench --docs             (LATEST.md and the docs' figures from LATEST.json)"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    parser.add_argument(
        "--only",
        action="append",
        choices=list(BENCHMARKS),
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
    parser.add_argument(
        "--docs",
        action="store_true",
        help="measure nothing: render LATEST.md and the docs' generated blocks from LATEST.json again",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    from fullthrottle.bench import docs
    from fullthrottle.bench.benchmarks import BENCHMARKS
    from fullthrottle.bench.benchmarks.base import REPO
    from fullthrottle.bench.results import LATEST, markdown_table, write_results
    from fullthrottle.bench.suite import run_suite, sizes_for

    if args.docs:
        for path in docs.update_pages():
            print(f"rewrote {path} from {docs.LATEST_JSON}")
        return 0
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
    mode = "quick" if args.quick else "full"
    document = run_suite(
        sizes=sizes_for(mode),
        mode=mode,
        work_dir=Path(args.work_dir) if args.work_dir else None,
        only=tuple(args.only) or tuple(BENCHMARKS),
    )
    json_path, md_path = write_results(document, results_dir)
    print(markdown_table(document))
    print(f"results: {json_path} and {md_path}")
    print(f"latest reading of each benchmark: {results_dir / f'{LATEST}.md'}")
    # The docs show the repo's latest results; a run written elsewhere leaves them alone.
    if results_dir.resolve() == (REPO / "bench" / "results").resolve():
        for path in docs.update_pages(results_dir / f"{LATEST}.json"):
            if path.name != f"{LATEST}.md":
                print(f"updated the generated blocks of {path}")
    failed = [name for name, part in document["results"].items() if "error" in part]
    if failed and document["work_dir"]:
        print(f"work folder (runs, data, logs of the failed benchmarks): {document['work_dir']}")
    return exit_status.FINDINGS if failed else exit_status.SUCCESS
