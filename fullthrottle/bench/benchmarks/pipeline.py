"""The pipeline benchmark: ``fullthrottle run`` on the bundled penguins data, in a subprocess
exactly as a user runs it (a fresh output folder); wall time and each component's seconds from
MLMD. The trainer, tracking, checkpoint and serving benchmarks use its run when it ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fullthrottle.bench.benchmarks.base import REPO, BenchmarkSpec, Context, Verdict, size
from trainer_module.training import metrics

NAME = "pipeline"


@dataclass(frozen=True)
class PipelineSizes:
    train_steps: int | None = size(
        None,
        "the pipeline's `training.train_steps` (– = the config's default, what `make run` does)",
    )


def run(context: Context, sizes: PipelineSizes) -> dict[str, Any]:
    out = context.work / "penguins_run"
    command = [sys.executable, "-m", "fullthrottle", "run", "--output-dir", str(out)]
    if sizes.train_steps:
        command += ["--set", f"training.train_steps={sizes.train_steps}"]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 3):
        raise RuntimeError(f"fullthrottle run exited {done.returncode}: {done.stderr[-2000:]}")
    last = json.loads((out / "last_run.json").read_text())
    seconds = {name: comp["seconds"] for name, comp in last["components"].items()}
    total = sum(seconds.values())
    training = last.get("training") or {}
    return {
        "output_dir": str(out),
        "wall_seconds": wall,
        "component_seconds": seconds,
        "component_share": {k: v / total for k, v in seconds.items()} if total else {},
        "training": {
            k: training.get(k)
            for k in (
                metrics.EXAMPLES_PER_SECOND,
                metrics.INPUT_WAIT_FRACTION,
                "precision_policy",
                "advisor",
            )
        },
        "blessed": last["blessed"],
    }


def rows(result: Mapping[str, Any], verdict: Verdict) -> list[str]:
    if "component_seconds" not in result:
        return []
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in result["component_seconds"].items())
    return [
        f"| pipeline: `fullthrottle run` on bundled penguins | wall {result['wall_seconds']:.0f} s: "
        f"{parts} | | |"
    ]


BENCHMARK = BenchmarkSpec(
    name=NAME,
    summary="`fullthrottle run` on the bundled data: wall time and each component's seconds",
    run=run,
    rows=rows,
    full=PipelineSizes(),
    # Quick mode trains 100 steps.
    quick=PipelineSizes(train_steps=100),
)
