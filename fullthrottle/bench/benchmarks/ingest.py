"""The ingest benchmark: big tabular input, from the file to the first training step.

Parquet vs CSV: the same generated penguins-shaped rows (``workloads.write_tabular_csv``)
written as a CSV file and as a Parquet file, each staged as ``fullthrottle run`` stages it
(timed) and read by the pipeline's ExampleGen (the Arrow ExampleGen, alone in a pipeline, cache
off); rows/s of each side by side. First run: a generated CSV of ``first_run_rows`` rows from
staging to the end of the Trainer's first loop of steps (the real pipeline: staging,
ExampleGen, StatisticsGen, the schema, ExampleValidator, the data gate, Transform, the Trainer
training one loop), in a fresh process: whole seconds per step and the peak resident set size
of the largest process of the run (itself or a Beam worker). One run per point (each is long).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fullthrottle.bench.benchmarks.base import (
    BenchmarkSpec,
    Context,
    Reading,
    Target,
    Verdict,
    size,
)

NAME = "ingest"
# The end-to-end target of the issue that asked for this benchmark: ExampleGen + StatisticsGen
# + Transform at >= 30k rows/s on these 2 cores.
END_TO_END = "ingest_first_run_rows_per_second"


@dataclass(frozen=True)
class IngestSizes:
    rows: int = size(1_000_000, "rows of the Parquet vs CSV pair (0: skipped)")
    first_run_rows: int = size(
        10_000_000, "CSV rows of the first run to the first training step (0: skipped)"
    )
    workers: int = size(2, "DirectRunner workers (multi_processing; 0: in_memory)")


def run(context: Context, sizes: IngestSizes) -> dict[str, Any]:
    if not sizes.rows and not sizes.first_run_rows:
        return {
            "skipped": "quick mode runs no ingest point (start-up dominates small inputs); the "
            "full mode measures Parquet vs CSV on 1M rows and a first run on 10M rows"
        }
    work = context.work / NAME
    result: dict[str, Any] = {}
    if sizes.rows:
        context.log(f"ingest: Parquet vs CSV, {sizes.rows:,} rows")
        result["formats"] = formats(work / f"formats-{sizes.rows}", sizes.rows, sizes.workers)
    if sizes.first_run_rows:
        context.log(f"ingest: first run to the first training step, {sizes.first_run_rows:,} rows")
        result["first_run"] = first_run_point(
            work / f"first-run-{sizes.first_run_rows}", sizes.first_run_rows, sizes.workers
        )
    return result


def ingest_config(output_dir: Any, path: Any, data_format: str, workers: int, name: str) -> Any:
    """A config for the pipeline on generated rows at `path`: cache off, `workers` Beam
    workers (multi_processing; 0: the default in-memory DirectRunner)."""
    from fullthrottle.bench.workloads import transform_prefix_config
    from fullthrottle.core.config import BeamConfig, DataSpec

    return transform_prefix_config(
        output_dir=str(output_dir),
        spec=dataclasses.replace(DataSpec(), path=str(path), format=data_format),
        beam=(
            BeamConfig(direct_running_mode="multi_processing", direct_num_workers=workers)
            if workers
            else BeamConfig()
        ),
        name=name,
    )


def formats(work: Any, rows: int, workers: int) -> dict[str, Any]:
    """The same rows as CSV and as Parquet: staging and ExampleGen seconds and rows/s of each."""
    import time

    from fullthrottle.bench.workloads import (
        time_example_gens,
        write_tabular_csv,
        write_tabular_parquet,
    )
    from fullthrottle.core.staging import prepare_data
    from pipelines.local_runner import build_local_pipeline

    csv_path = write_tabular_csv(work / "data.csv", rows)
    paths = {"csv": csv_path, "parquet": write_tabular_parquet(csv_path, work / "data.parquet")}
    out: dict[str, Any] = {"rows": rows, "workers": workers}
    for data_format, path in paths.items():
        cfg = ingest_config(
            work / f"run-{data_format}", path, data_format, workers, "fullthrottle-bench-ingest"
        )
        started = time.perf_counter()
        prepared = prepare_data(cfg)
        staging = time.perf_counter() - started
        beam_args = build_local_pipeline(cfg, input_base=prepared.input_base).beam_pipeline_args
        seconds = time_example_gens(
            prepared.input_base,
            work / f"example-gen-{data_format}",
            beam_pipeline_args=beam_args,
            kinds=("arrow",),
        )["arrow"]
        out[data_format] = {
            "staged_rows": prepared.rows,
            "staging_seconds": staging,
            "example_gen_seconds": seconds,
            "staging_rows_per_second": rows / staging if staging else None,
            "example_gen_rows_per_second": rows / seconds if seconds else None,
        }
    return out


def first_run_point(work: Any, rows: int, workers: int) -> dict[str, Any]:
    """A first run on `rows` generated CSV rows, in a fresh process (`workloads.in_child`)."""
    from fullthrottle.bench.workloads import first_run, in_child, write_tabular_csv

    csv_path = write_tabular_csv(work / "data.csv", rows)
    cfg = ingest_config(work / "run", csv_path, "csv", workers, "fullthrottle-bench-first-run")
    outcome, peak_rss = in_child(first_run, cfg, job=work / "job")
    steps = outcome["step_seconds"]
    rate_steps = ("ExampleGen", "StatisticsGen", "Transform")
    rate_seconds = sum(steps[s] or 0.0 for s in rate_steps)
    return {
        "rows": rows,
        "workers": workers,
        "step_seconds": steps,
        "total_seconds": sum(v or 0.0 for v in steps.values()),
        "peak_rss_bytes": peak_rss,
        "end_to_end_rows_per_second": rows / rate_seconds if rate_seconds else None,
    }


def _end_to_end(result: Mapping[str, Any]) -> Reading | None:
    value = (result.get("first_run") or {}).get("end_to_end_rows_per_second")
    return Reading(value=value) if value is not None else None


def rows(result: Mapping[str, Any], verdict: Verdict) -> list[str]:
    out = []
    pair = result.get("formats")
    if pair:
        csv, parquet = pair["csv"], pair["parquet"]
        ratio = parquet["example_gen_rows_per_second"] / csv["example_gen_rows_per_second"]
        out.append(
            f"| Ingest: ExampleGen, Parquet vs CSV, {pair['rows']:,} rows, {pair['workers']} "
            f"worker(s) | {parquet['example_gen_rows_per_second']:,.0f} vs "
            f"{csv['example_gen_rows_per_second']:,.0f} rows/s (staging "
            f"{parquet['staging_rows_per_second']:,.0f} vs {csv['staging_rows_per_second']:,.0f} "
            f"rows/s) | {ratio:.2f}x | |"
        )
    point = result.get("first_run")
    if point:
        steps = ", ".join(
            f"{step} {value:.0f} s" for step, value in point["step_seconds"].items() if value
        )
        rate = point["end_to_end_rows_per_second"]
        out.append(
            f"| Ingest: first run to the first training step, {point['rows']:,} CSV rows, "
            f"{point['workers']} worker(s) | {steps}; {point['total_seconds']:.0f} s in all, "
            f"peak RSS {point['peak_rss_bytes'] / 2**30:.1f} GiB | "
            f"{rate:,.0f} rows/s (ExampleGen + StatisticsGen + Transform) | "
            f"{verdict(END_TO_END)} |"
        )
    return out


BENCHMARK = BenchmarkSpec(
    name=NAME,
    summary="Parquet vs CSV rows/s, and a 10M-row first run to the first training step (full mode)",
    run=run,
    rows=rows,
    full=IngestSizes(),
    # Quick mode runs no ingest point: `make bench QUICK=1` stays under 5 minutes.
    quick=IngestSizes(rows=0, first_run_rows=0),
    targets=(
        Target(
            name=END_TO_END,
            line=30_000,
            measured_as="rows / (ExampleGen + StatisticsGen + Transform seconds) of the first run "
            "(full mode: 10M generated CSV rows, 2 workers)",
            read=_end_to_end,
        ),
    ),
)
