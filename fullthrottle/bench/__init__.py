"""fullthrottle's benchmark suite (`fullthrottle bench`, `make bench`); see docs/performance.md.

Modules: ``benchmarks`` (the registry: one module per benchmark with its run, table rows, sizes
and targets), ``suite`` (runs the selected benchmarks into a results document), ``verdicts``
(targets judged, decided or not), ``results`` (the tables, ``<timestamp>.json``/``.md`` and the
newest reading of each benchmark in ``LATEST.json``/``LATEST.md``), ``docs`` (the docs'
generated blocks), ``measure`` (alternating windows, medians, ratios, intervals), ``workloads``
(generated data, the real pipeline's prefix, Transform outputs read from MLMD), ``trainer``
(our loop, the TFX-example baseline, a strong ``fit``, readers, FLOPs, matmul ceiling, tracking
and checkpoint rates), ``model_process`` (one model's trainer benchmarks in a fresh process),
``tracked`` (one real ``train()`` with or without MLflow), ``serving`` (REST server vs in
process).
"""
