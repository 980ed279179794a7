"""The serving benchmark runs end to end at a tiny size (its numbers are not asserted).

Its version switch is asserted: REST and gRPC clients on the `champion` label while a new
version is pushed and the MLflow alias moves get no failed request, and both see the switch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fullthrottle.bench.serving import run_serving_benchmark
from tests.helpers import eval_split_examples, last_run, strip_label

pytestmark = pytest.mark.slow


def test_serving_benchmark_runs_without_errors(penguins_run):
    output_dir, _ = penguins_run
    last = last_run(output_dir)
    examples = [strip_label(r, "species") for r in eval_split_examples(last, limit=8)]
    result = run_serving_benchmark(
        serving_dir=str(Path(last["pushed_model_dir"]).parent),
        examples=examples,
        requests=24,
        concurrency=4,
        switch_seconds=4.0,
    )
    for part in ("server", "in_process"):
        assert result[part]["errors"] == 0, result[part]["first_errors"]
        assert result[part]["requests"] == 24
        assert (
            result[part]["p50_ms"] is not None and result[part]["p99_ms"] >= result[part]["p50_ms"]
        )
    assert result["version"] == int(Path(last["pushed_model_dir"]).name)

    switch = result["switch"]
    assert switch.get("server_traceback") is None, switch["server_traceback"]
    assert switch["new_version"] > switch["old_version"]
    for protocol in ("rest", "grpc"):
        part = switch[protocol]
        assert part["errors"] == 0, part["first_errors"]
        assert part["requests"] > 0 and part["p99_ms"] >= part["p50_ms"]
        # Answered by the old version first, then by the new one once the label moved.
        assert part["versions"] == [switch["old_version"], switch["new_version"]], part
