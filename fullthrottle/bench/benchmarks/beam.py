"""The Beam benchmark: the real pipeline's prefix (ExampleGen to Transform, the same nodes and
code as ``fullthrottle run``, cache off) on generated penguins-shaped CSVs, DirectRunner
``multi_processing`` with 1 and 2 workers; rows/s = rows / (ExampleGen + Transform seconds
from MLMD), and each step's own rows/s (staging, ExampleGen, StatisticsGen, DataGate,
Transform). At the largest size, TFX's stock ``CsvExampleGen`` and the pipeline's Arrow
ExampleGen on the same staged files, one after the other (rows/s of each, and the ratio). One
run per point (each is long)."""

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
        time_example_gens,
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
    example_gens: dict[str, Any] = {}
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
                    "staging_seconds": outcome["staging_seconds"],
                    "component_seconds": secs,
                }
            )
        if rows == max(sizes.rows):
            # Stock vs Arrow ExampleGen on the files the last point staged, with its Beam args.
            pair = time_example_gens(
                outcome["input_base"],
                work / f"rows{rows}-example-gens",
                beam_pipeline_args=outcome["beam_pipeline_args"],
            )
            example_gens = {
                "rows": rows,
                "workers": sizes.workers[-1],
                "stock_seconds": pair["stock"],
                "arrow_seconds": pair["arrow"],
                "stock_rows_per_second": rows / pair["stock"] if pair["stock"] else None,
                "arrow_rows_per_second": rows / pair["arrow"] if pair["arrow"] else None,
            }
    by = {(p["rows"], p["workers"]): p for p in points}
    two_vs_one = {
        str(rows): by[(rows, 2)]["rows_per_second"] / by[(rows, 1)]["rows_per_second"]
        for rows in sizes.rows
        if (rows, 1) in by and (rows, 2) in by
    }
    return {"points": points, "two_vs_one_workers": two_vs_one, "example_gens": example_gens}


# The steps whose rows/s the per-step row shows, as MLMD names them (staging is timed apart).
STEPS = ("ExampleGen", "StatisticsGen", "DataGate", "Transform")


def _step_rates(point: Mapping[str, Any]) -> str:
    rows_n = point["rows"]
    seconds = {"staging": point.get("staging_seconds")}
    for step in STEPS:
        seconds[step] = next(
            (v for k, v in point["component_seconds"].items() if k.endswith(step)), None
        )
    return ", ".join(f"{step} {rows_n / value:,.0f}" for step, value in seconds.items() if value)


def rows(result: Mapping[str, Any], verdict: Verdict) -> list[str]:
    if "points" not in result:
        return []
    out = [
        f"| Beam: ExampleGen + Transform, {p['rows']:,} rows, {p['workers']} worker(s) | "
        f"{p['rows_per_second']:,.0f} rows/s (ExampleGen {p['example_gen_seconds']:.1f} s, "
        f"Transform {p['transform_seconds']:.1f} s) | | |"
        for p in result["points"]
    ]
    out += [
        f"| Beam: rows/s per step, {p['rows']:,} rows, {p['workers']} worker(s) | "
        f"{_step_rates(p)} | | |"
        for p in result["points"]
        if "staging_seconds" in p
    ]
    for rows_n, value in result["two_vs_one_workers"].items():
        out.append(f"| Beam: 2 vs 1 workers, {int(rows_n):,} rows | | {value:.2f}x | |")
    pair = result.get("example_gens")
    if pair and pair["stock_seconds"] and pair["arrow_seconds"]:
        out.append(
            f"| Beam: ExampleGen, stock CsvExampleGen vs Arrow, {pair['rows']:,} rows, "
            f"{pair['workers']} worker(s) | {pair['stock_rows_per_second']:,.0f} vs "
            f"{pair['arrow_rows_per_second']:,.0f} rows/s | "
            f"{pair['stock_seconds'] / pair['arrow_seconds']:.2f}x | |"
        )
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
