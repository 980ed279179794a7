"""The Beam benchmark: the real pipeline's prefix (ExampleGen to Transform, the same nodes and
code as ``fullthrottle run``, cache off) on generated penguins-shaped CSVs, DirectRunner
``multi_processing`` with 1 and 2 workers; rows/s = rows / (ExampleGen + Transform seconds
from MLMD). One run per point (each is long)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fullthrottle.bench.benchmarks.base import BenchmarkSpec, Context, Verdict, size

NAME = "beam"


@dataclass(frozen=True)
class BeamSizes:
    rows: tuple[int, ...] = size(
        (250_000, 500_000, 1_000_000), "Beam scaling points (none: skipped)"
    )
    workers: tuple[int, ...] = size((1, 2), "DirectRunner workers per point")


def run(context: Context, sizes: BeamSizes) -> dict[str, Any]:
    from fullthrottle.bench.workloads import (
        example_gen_name,
        run_transform_prefix,
        transform_prefix_config,
        write_tabular_csv,
    )
    from fullthrottle.core.config import BeamConfig, DataSpec

    if not sizes.rows:
        return {
            "skipped": "quick mode runs no Beam scaling point (start-up dominates small inputs); "
            "the full mode measures 250k-1M rows with 1 and 2 workers"
        }
    work = context.work / "beam"
    points = []
    for rows in sizes.rows:
        csv_path = write_tabular_csv(work / f"rows{rows}" / "data.csv", rows)
        for workers in sizes.workers:
            cfg = transform_prefix_config(
                output_dir=str(work / f"rows{rows}-w{workers}"),
                spec=dataclasses.replace(DataSpec(), path=str(csv_path)),
                beam=BeamConfig(direct_running_mode="multi_processing", direct_num_workers=workers),
                name="fullthrottle-bench-beam",
            )
            outcome = run_transform_prefix(cfg)
            secs = outcome["component_seconds"]
            gen = example_gen_name(secs)
            work_seconds = secs[gen] + secs["Transform"]
            points.append(
                {
                    "rows": rows,
                    "workers": workers,
                    "example_gen_seconds": secs[gen],
                    "transform_seconds": secs["Transform"],
                    "rows_per_second": rows / work_seconds if work_seconds else None,
                    "prefix_wall_seconds": outcome["wall_seconds"],
                    "component_seconds": secs,
                }
            )
    by = {(p["rows"], p["workers"]): p for p in points}
    two_vs_one = {
        str(rows): by[(rows, 2)]["rows_per_second"] / by[(rows, 1)]["rows_per_second"]
        for rows in sizes.rows
        if (rows, 1) in by and (rows, 2) in by
    }
    return {"points": points, "two_vs_one_workers": two_vs_one}


def rows(result: Mapping[str, Any], verdict: Verdict) -> list[str]:
    if "points" not in result:
        return []
    out = [
        f"| Beam: ExampleGen + Transform, {p['rows']:,} rows, {p['workers']} worker(s) | "
        f"{p['rows_per_second']:,.0f} rows/s (ExampleGen {p['example_gen_seconds']:.1f} s, "
        f"Transform {p['transform_seconds']:.1f} s) | | |"
        for p in result["points"]
    ]
    for rows_n, value in result["two_vs_one_workers"].items():
        out.append(f"| Beam: 2 vs 1 workers, {int(rows_n):,} rows | | {value:.2f}x | |")
    return out


BENCHMARK = BenchmarkSpec(
    name=NAME,
    summary="ExampleGen + Transform rows/s on generated CSVs, 1 vs 2 Beam workers (full mode)",
    run=run,
    rows=rows,
    full=BeamSizes(),
    # Quick mode skips Beam scaling: its one quick point (5k rows, 1 worker) measured worker and
    # pipeline start-up only (101 rows/s, 70 s of a 498 s quick suite on an AVX2-only EPYC);
    # the pipeline row gives ExampleGen's and Transform's seconds on the bundled data.
    quick=BeamSizes(rows=(), workers=(1,)),
)
