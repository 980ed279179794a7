"""The checkpoint benchmark: periodic saves traced vs eager
(``training.traced_checkpoint_saves``) around the real ``train()`` on the tabular data at the
default cadence, whose short steps make the saves' cost visible; and the saves' share of the
training time for each. A lever: no target rides on it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fullthrottle.bench.benchmarks.base import (
    BenchmarkSpec,
    Context,
    Verdict,
    ratio_entry,
    ratio_row,
    size,
)
from fullthrottle.bench.measure import describe

NAME = "checkpoints"


@dataclass(frozen=True)
class CheckpointSizes:
    train_steps: int = size(5000, "steps per checkpoint-lever run")
    # 12 pairs of 5,000 steps measured 1.29x paired [1.16-1.39] standalone on the AVX2-only
    # EPYC; 0 skips it (quick mode: a lever, no target rides on it, and quick mode has no time
    # to spare on that machine).
    repeats: int = size(9, "traced/eager pairs (0: the row is skipped)")


def run(context: Context, sizes: CheckpointSizes) -> dict[str, Any]:
    if not sizes.repeats:
        return {"skipped": "repeats is 0 (quick mode runs no checkpoint lever)"}
    from fullthrottle.bench.trainer import checkpoint_rates
    from fullthrottle.bench.workloads import TABULAR_TRAINING

    data = context.tabular_data()
    config = dataclasses.replace(TABULAR_TRAINING, train_steps=sizes.train_steps)
    measured = checkpoint_rates(data, config, repeats=sizes.repeats)
    entry = ratio_entry(measured["samples"], "traced", "eager")
    entry["train_steps"] = config.train_steps
    entry["checkpoint_every_steps"] = config.checkpoint_every_steps
    entry["saves"] = measured["saves"]  # as train() reported them: {"traced": ["traced"], ...}
    entry["checkpoint_share"] = {
        name: describe(values)["median"] for name, values in measured["checkpoint_share"].items()
    }
    return entry


def rows(result: Mapping[str, Any], verdict: Verdict) -> list[str]:
    if "ratio" not in result:
        return []
    share = result["checkpoint_share"]
    return [
        ratio_row(
            f"checkpoints: periodic saves traced vs eager (`training.traced_checkpoint_saves`; "
            f"real `train()`, tabular, {result['train_steps']} steps, a save every "
            f"{result['checkpoint_every_steps']}; saves {share['traced']:.1%} vs "
            f"{share['eager']:.1%} of the training time)",
            result,
        )
    ]


BENCHMARK = BenchmarkSpec(
    name=NAME,
    summary="periodic checkpoint saves traced vs eager around the real `train()` (full mode)",
    run=run,
    rows=rows,
    full=CheckpointSizes(),
    quick=CheckpointSizes(repeats=0),
)
