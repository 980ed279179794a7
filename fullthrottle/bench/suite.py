"""The benchmark suite: runs the selected benchmarks of the registry (``benchmarks.BENCHMARKS``)
in its order and returns the results document; ``results.write_results`` writes it.

Sizes differ between modes only in how much is measured (each benchmark's own sizes); the code
path is the same. Each benchmark's failure is recorded in the results (and shown in the table)
instead of stopping the suite, so one broken part does not hide the others' numbers.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fullthrottle.bench.benchmarks import BENCHMARKS, Context
from fullthrottle.bench.benchmarks.base import REPO
from fullthrottle.bench.verdicts import judge

MODES = ("full", "quick")


def sizes_for(mode: str, **changes: Mapping[str, Any]) -> dict[str, Any]:
    """Every benchmark's sizes in ``mode`` ("full" or "quick"), with ``changes`` (benchmark
    name -> {size: value}) applied: ``sizes_for("quick", trainer={"repeats": 2})``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    unknown = set(changes) - set(BENCHMARKS)
    if unknown:
        raise ValueError(f"no such benchmark(s): {sorted(unknown)}; known: {list(BENCHMARKS)}")
    return {
        name: dataclasses.replace(getattr(spec, mode), **changes.get(name, {}))
        for name, spec in BENCHMARKS.items()
    }


def machine() -> dict[str, Any]:
    import tensorflow as tf

    from trainer_module.training.hardware import cpu_info, device_facts, tensorflow_gpus

    facts = device_facts()
    return {
        "cpu": cpu_info().model or "",
        **facts.describe(),
        "gpus": [gpu.name for gpu in tensorflow_gpus()],
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "platform": platform.platform(),
    }


def _guarded(
    name: str, fn: Callable[[], dict[str, Any]], log: Callable[[str], None]
) -> dict[str, Any]:
    log(f"bench: {name} ...")
    started = time.perf_counter()
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - recorded in the results and the table, never hidden
        result = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-4000:]}
        log(f"bench: {name} FAILED: {result['error']}")
    result["bench_seconds"] = time.perf_counter() - started
    log(f"bench: {name} done in {result['bench_seconds']:.0f} s")
    return result


def run_suite(
    *,
    sizes: Mapping[str, Any],
    mode: str,
    work_dir: Path | None = None,
    only: Sequence[str] = tuple(BENCHMARKS),
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """Runs the selected benchmarks (``sizes``: benchmark name -> its sizes, as
    :func:`sizes_for` gives them) and returns the results document (not written).

    Pipeline runs and data go to ``work_dir``, or without one to a temp folder that is removed
    after a run where every benchmark succeeded (full mode writes generated CSVs of up to 1M
    rows and their pipeline outputs) and kept when one failed, for its logs
    (``document["work_dir"]``).
    """
    scratch = work_dir is None
    work = Path(work_dir or tempfile.mkdtemp(prefix="fullthrottle-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict[str, Any] = {}
    context = Context(work=work, results=results, log=log)
    for name, spec in BENCHMARKS.items():
        if name in only:
            results[name] = _guarded(name, lambda s=spec: s.run(context, sizes[s.name]), log)
    document = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": mode,
        "command": "fullthrottle bench" + (" --quick" if mode == "quick" else ""),
        "git_commit": _git_commit(),
        "machine": machine(),
        "sizes": {name: dataclasses.asdict(value) for name, value in sizes.items()},
        "suite_seconds": time.perf_counter() - started,
        "work_dir": str(work),
        "results": results,
    }
    document["targets"] = judge(results)
    if scratch and not any("error" in part for part in results.values()):
        shutil.rmtree(work, ignore_errors=True)
        document["work_dir"] = None
    return document


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        return out.stdout.strip() or None
    except OSError:
        return None
