"""The serving benchmark: ``fullthrottle serve`` on the model the pipeline benchmark pushed,
concurrent REST clients, against the same SavedModel's signature called in process from as
many threads (``fullthrottle/bench/serving.py``); requests/s and p50."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullthrottle.bench.benchmarks.base import BenchmarkSpec, Context, Verdict, size

NAME = "serving"


@dataclass(frozen=True)
class ServingSizes:
    requests: int = size(1000, "REST and in-process requests")
    concurrency: int = size(8, "client threads")


def run(context: Context, sizes: ServingSizes) -> dict[str, Any]:
    try:
        from fullthrottle.bench.serving import run_serving_benchmark
    except ImportError as exc:
        return {"skipped": f"serving benchmark not available: {exc}"}
    from fullthrottle.bench.workloads import raw_eval_examples

    pipeline = context.pipeline
    if not (pipeline and pipeline.get("blessed")):
        return {"skipped": "no pushed model (the pipeline benchmark did not push)"}
    out = Path(pipeline["output_dir"])
    last = json.loads((out / "last_run.json").read_text())
    examples = raw_eval_examples(last["pipeline_root"], label="species", limit=64)
    return run_serving_benchmark(
        serving_dir=last["serving_dir"],
        examples=examples,
        model_name=last["model_name"],
        requests=sizes.requests,
        concurrency=sizes.concurrency,
    )


def rows(result: Mapping[str, Any], verdict: Verdict) -> list[str]:
    out = []
    if "server" in result:
        server, local = result["server"], result["in_process"]
        out.append(
            f"| serving: REST (`fullthrottle serve`) vs in-process SavedModel | "
            f"{server['requests_per_second']:,.0f} vs {local['requests_per_second']:,.0f} req/s "
            f"(p50 {server['p50_ms']:.1f} ms vs {local['p50_ms']:.1f} ms) | "
            f"{result['server_vs_in_process']:.2f}x | |"
        )
    switch = result.get("switch")
    if switch and "rest" in switch:
        rest, grpc = switch["rest"], switch["grpc"]
        out.append(
            f"| serving: version switch under load, {switch['clients_per_protocol']} REST + "
            f"{switch['clients_per_protocol']} gRPC clients on the `champion` label | "
            f"REST p50 {rest['p50_ms']:.1f} / p99 {rest['p99_ms']:.1f} ms, "
            f"gRPC p50 {grpc['p50_ms']:.1f} / p99 {grpc['p99_ms']:.1f} ms | "
            f"{rest['errors'] + grpc['errors']} failed of {rest['requests'] + grpc['requests']} | |"
        )
    return out


BENCHMARK = BenchmarkSpec(
    name=NAME,
    summary="`fullthrottle serve` under concurrent REST clients vs the SavedModel in process",
    run=run,
    rows=rows,
    full=ServingSizes(),
    quick=ServingSizes(requests=200, concurrency=4),
)
