"""fullthrottle's benchmark suite (`fullthrottle bench`, `make bench`); see docs/performance.md.

Modules: ``measure`` (alternating windows, medians, ratios, intervals), ``workloads`` (generated
data, the real pipeline's prefix, Transform outputs read from MLMD), ``trainer`` (our loop, the
TFX-example baseline, readers, FLOPs, matmul ceiling, tracking and checkpoint rates),
``tracked`` (one real ``train()`` with or without MLflow), ``serving`` (REST server vs in
process), ``model_process`` (one model's benchmarks in a fresh process), ``suite`` (runs
everything, writes ``bench/results/<timestamp>.json`` and ``.md`` and the newest reading of
each benchmark in ``bench/results/LATEST.json`` and ``LATEST.md``).
"""

from fullthrottle.bench.suite import FULL, QUICK, Sizes, markdown_table, run_suite, write_results

__all__ = ["FULL", "QUICK", "Sizes", "markdown_table", "run_suite", "write_results"]
