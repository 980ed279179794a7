"""fullthrottle's benchmark suite (`fullthrottle bench`, `make bench`); see docs/performance.md.

Modules: ``measure`` (alternating windows, medians, ratios), ``data`` (generated data, the real
pipeline's prefix, Transform outputs read from MLMD), ``trainer`` (our loop, the TFX-example
baseline, readers, FLOPs, matmul ceiling, tracking overhead), ``suite`` (runs everything,
writes ``bench/results/<timestamp>.json`` and ``.md``).
"""

from fullthrottle.bench.suite import FULL, QUICK, Sizes, markdown_table, run_suite, write_results

__all__ = ["FULL", "QUICK", "Sizes", "markdown_table", "run_suite", "write_results"]
