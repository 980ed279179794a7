"""The benchmark registry: every benchmark of ``fullthrottle bench``, by name, in the order the
suite runs them and the table shows them.

A benchmark is one module here defining a :class:`~fullthrottle.bench.benchmarks.base.
BenchmarkSpec`: its ``run``, its table ``rows``, its sizes in full and quick mode, its
targets. :data:`BENCHMARKS` is the only list of them: ``--only``, the suite, the verdicts, the
results table, ``LATEST.json`` and the docs' generated tables of targets and sizes all look a
benchmark up here.

Adding a benchmark (say ``export``): write ``benchmarks/export.py`` with a frozen sizes dataclass
(fields made with ``base.size``), ``run(context, sizes)`` returning a JSON-able dict,
``rows(result, verdict)`` returning its table rows, and its ``Target``s if it has any, ending in
``BENCHMARK = BenchmarkSpec(name="export", ...)``; then add it to :data:`BENCHMARKS`. Adding a
row to a benchmark touches that benchmark's module only: its result, its ``rows`` and, when the
row has a target, one ``Target``.
"""

from __future__ import annotations

from fullthrottle.bench.benchmarks import (
    beam,
    checkpoints,
    ingest,
    pipeline,
    serving,
    tracking,
    trainer,
)
from fullthrottle.bench.benchmarks.base import BenchmarkSpec, Context, Reading, Target

# Run order: the pipeline first (its run feeds the trainer, tracking, checkpoint and serving
# benchmarks), the long Beam scaling points and ingest runs before serving.
BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        pipeline.BENCHMARK,
        trainer.BENCHMARK,
        tracking.BENCHMARK,
        checkpoints.BENCHMARK,
        beam.BENCHMARK,
        ingest.BENCHMARK,
        serving.BENCHMARK,
    )
}

__all__ = ["BENCHMARKS", "BenchmarkSpec", "Context", "Reading", "Target", "all_targets"]


def all_targets() -> list[Target]:
    """Every benchmark's targets, in the registry's order."""
    targets = [t for spec in BENCHMARKS.values() for t in spec.targets]
    names = [t.name for t in targets]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"target names must be unique across the suite: {duplicated}")
    return targets
