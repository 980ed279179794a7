"""The benchmark suite: runs every benchmark, writes ``<results>/<timestamp>.json`` and ``.md``
and merges the run's readings into ``<results>/LATEST.json`` and ``LATEST.md``.

Sizes differ between modes only in how much is measured (``Sizes``); the code path is the
same. Each benchmark's failure is recorded in the results (and shown in the table) instead of
stopping the suite, so one broken part does not hide the others' numbers.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullthrottle.bench.measure import (
    INTERVAL_CONFIDENCE,
    alternate,
    describe,
    median_interval,
    ratio,
)

REPO = Path(__file__).resolve().parent.parent.parent
BENCHMARKS = ("pipeline", "trainer", "tracking", "checkpoints", "beam", "serving")

TARGETS = {
    "transformer_vs_tfx_example": 2.0,
    "transformer_vs_strong_fit": 1.0,
    "tabular_vs_strong_fit": 1.0,
    "transformer_mfu": 0.70,
    "transformer_input_efficiency": 0.97,
    "tabular_input_efficiency": 0.97,
    "tabular_streaming_b64": 0.9,
    "tabular_streaming_b256": 0.9,
    # The same lines for the streaming reader on pre-batched copies (`input_snapshot_dir`).
    "tabular_streaming_prebatched_b64": 0.9,
    "tabular_streaming_prebatched_b256": 0.9,
    # Examples per CPU-second of the streaming reader alone (a rate, not a ratio).
    "tabular_reader_per_core": 400_000,
    "tabular_reader_prebatched_per_core": 400_000,
    "tracking_on_vs_off": 0.98,
}
# Streaming input efficiency's batch sizes (targets `tabular_streaming_b<size>`).
STREAMING_BATCH_SIZES = (64, 256)


@dataclass(frozen=True)
class Sizes:
    """How much each benchmark measures."""

    repeats: int = 5
    # Tabular windows are ~1.1 s: more of them cost little and steady the paired median. On a
    # shared 2-core machine the same code gave paired ratios anywhere in 0.93-1.00 with 5;
    # paired medians of 0.959-1.003 over nine runs with 15 (about one pair in ten below 0.9,
    # when the machine's state flipped between its two windows); 0.953-1.016 over seven with 25.
    tabular_repeats: int = 40
    transformer_window_steps: int = 50
    # When set, the Transformer's windows are this many seconds of ours instead (steps from
    # ours' step time measured after its warm-up; at least 2): a float32 step took 0.47 s on an
    # AVX2-only EPYC and a bf16 step 0.08 s on an AVX512_BF16 one, so a fixed step count cannot
    # keep quick mode under 5 minutes on both.
    transformer_window_seconds: float | None = None
    # Tabular steps take ~0.22 ms: 5,000 steps are ~1.1 s per window (1,000 steps swung +-10%).
    tabular_window_steps: int = 5000
    # The tabular `fit` baseline's window (None = tabular_window_steps): at ~75k examples/s its
    # 5,000 steps took ~4.3 s of each repetition; its ratio (~4-5x, no target on it) needs no
    # more, and half of it pays for the extra repetitions above.
    tabular_baseline_window_steps: int | None = 2500
    # Tabular input efficiency's own pairs, after the repetitions above: ours and in-memory
    # alone, alternated, in windows of tabular_input_window_steps; the ratio is taken over these
    # and the repetitions' pairs together. Its paired ratios spread about +-10% (sd) on the
    # AVX2-only EPYC whatever the window's length (5,000 steps: 0.82-1.29 over 40 pairs; 2,000
    # steps: 90% intervals +-2.4-4.8% over 60 pairs), so the interval narrows with the number
    # of pairs, and short windows buy them cheapest: 120 pairs of 2,000 steps are ~250 s there.
    # 40 pairs gave intervals ~0.06 wide. The interval covers one run's windows only: two runs
    # of 160 pairs in one process each gave [0.975-0.998] and [0.938-0.977].
    # So the pairs are spread over processes, the run being a unit of its own: the tabular
    # model's process takes tabular_input_pairs after its repetitions, and each of
    # tabular_input_processes more fresh processes (a new model and input pipelines: ~6 s more
    # each here, 172 s for 2 x 40 pairs against 80 s for 40 in the model's process) takes as
    # many. The ratio is taken over all pairs; the verdict is decided only if every process's
    # paired median falls on its side of the line too (`targets`).
    tabular_input_pairs: int = 40
    tabular_input_window_steps: int = 2000
    tabular_input_processes: int = 2
    # Steps each Transformer contender runs before its windows (None = one loop of the config's
    # steps_per_loop, as for the tabular model, whose 50 steps take ~20 ms). The first step
    # traces the loop. Quick mode takes 3: at 0.47 s per float32 step (AMD EPYC without
    # AVX512), cutting four contenders' 50-step warm-ups to 3 took the quick suite from 620 to
    # 498 s.
    transformer_warmup_steps: int | None = None
    # The fused-kernels lever, side by side (Transformer only; no target rides on it). Quick mode
    # leaves it out: its build, tracing and windows were an estimated ~12 s (not measured on
    # their own) of a 292 s quick suite on the AVX2-only EPYC.
    fused_vs_unfused: bool = True
    reader_batches: int = 400
    # Square 2048 matmuls chained per ceiling measurement (one per repetition and model): 10
    # took 1.5 s in float32 on the AVX2-only EPYC (113 GFLOP/s), 0.2 s in bf16 on the
    # AVX512_BF16 one. Quick mode chains 4 (0.6 s there): 8 measurements, ~7 s of its budget.
    ceiling_iterations: int = 10
    # Tabular steps take ~0.3 ms: 20k steps are ~5-10 s of training per sample (200 steps were
    # ~0.1 s and gave ratios anywhere in 0.78-1.10; 20k still spread over 0.93-1.02). The
    # overhead is ~1% measured standalone, while one contender's samples spread +-8% on a shared
    # 2-core machine: 5 reps gave paired medians of 0.95-1.02 for the same code, 9 reps
    # 0.970-1.014 over four full runs. 13 cost ~100 s more than 9.
    tracking_train_steps: int = 20_000
    tracking_repeats: int = 13
    # Traced vs eager periodic saves (training.traced_checkpoint_saves), real `train()` on the
    # tabular data at the default cadence. 12 pairs of 5,000 steps measured 1.29x paired
    # [1.16-1.39] standalone on the AVX2-only EPYC; 0 skips it (quick mode: a lever, no target
    # rides on it, and quick mode has no time to spare on that machine).
    checkpoint_train_steps: int = 5000
    checkpoint_repeats: int = 9
    beam_rows: tuple[int, ...] = (250_000, 500_000, 1_000_000)
    beam_workers: tuple[int, ...] = (1, 2)
    serving_requests: int = 1000
    serving_concurrency: int = 8
    pipeline_train_steps: int | None = None  # None = the config's default (what `make run` does)
    # Streaming input efficiency (tabular): generated rows, once, kept in a cache folder
    # (`workloads.streaming_tabular_data`). 6.4M rows are ~180 MB of gzip files, past
    # `cache: auto`'s line on a 24 GiB machine (10% of RAM / 20); quick mode's 300k are not,
    # and its streaming contender still reads with `cache: false`. In quick mode, 3 pairs of
    # 100k-example windows per batch size, with the pre-batched contender and both reader rows,
    # took 32 s of a 422 s quick suite on a shared 2-core machine at load average ~4.8; 2
    # pairs of 60k take about half.
    streaming_rows: int = 6_400_000
    streaming_files: int = 8
    streaming_repeats: int = 7
    streaming_window_examples: int = 1_000_000
    # Options of the Transformer benchmark's model (`training.models.transformer`), e.g. d_model.
    transformer_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)


FULL = Sizes()
# Quick mode (< 5 minutes on 2 shared cores): the same benchmarks, less of each, except Beam
# scaling, which it skips: its one quick point (5k rows, 1 worker) measured worker and pipeline
# start-up only (101 rows/s, 70 s of a 498 s quick suite on an AVX2-only EPYC); the pipeline
# row gives ExampleGen's and Transform's seconds on the bundled data. The pipeline trains 100
# steps, tracking 2,000 (2 pairs); Transformer windows are ~1.5 s of ours. On that machine the
# suite took 290 s (5:01 for the command) with 3 tracking pairs and 10-matmul ceilings, 280 s
# (4:52) with 2 pairs and 4 matmuls; a tabular `fit` window of 500 steps instead of 1,000 (its
# ratio is ~5x, no target) saves ~1.4 s a repetition more.
QUICK = Sizes(
    repeats=3,
    tabular_repeats=5,
    transformer_window_steps=10,
    fused_vs_unfused=False,
    transformer_window_seconds=1.5,
    transformer_warmup_steps=3,
    tabular_window_steps=2000,
    tabular_baseline_window_steps=500,
    reader_batches=200,
    tracking_train_steps=2_000,
    tracking_repeats=2,
    checkpoint_repeats=0,
    tabular_input_pairs=0,
    tabular_input_processes=0,
    ceiling_iterations=4,
    beam_rows=(),
    beam_workers=(1,),
    serving_requests=200,
    serving_concurrency=4,
    pipeline_train_steps=100,
    streaming_rows=300_000,
    streaming_files=4,
    streaming_repeats=2,
    streaming_window_examples=60_000,
)


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


def ratio_entry(
    samples: dict[str, list[float]], num: str, den: str, unit: str = "examples/s"
) -> dict[str, Any]:
    return {
        "unit": unit,
        num: describe(samples[num]),
        den: describe(samples[den]),
        **ratio(samples, num, den),
    }


# ------------------------------------------------------------------------------ benchmarks
def bench_pipeline(work: Path, sizes: Sizes) -> dict[str, Any]:
    """`fullthrottle run` on the bundled penguins data (a fresh output folder), in a subprocess
    exactly as a user runs it; wall time and per-component seconds from MLMD."""
    out = work / "penguins_run"
    command = [sys.executable, "-m", "fullthrottle", "run", "--output-dir", str(out)]
    if sizes.pipeline_train_steps:
        command += ["--set", f"training.train_steps={sizes.pipeline_train_steps}"]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 3):
        raise RuntimeError(f"fullthrottle run exited {done.returncode}: {done.stderr[-2000:]}")
    last = json.loads((out / "last_run.json").read_text())
    seconds = {name: comp["seconds"] for name, comp in last["components"].items()}
    total = sum(seconds.values())
    return {
        "output_dir": str(out),
        "wall_seconds": wall,
        "component_seconds": seconds,
        "component_share": {k: v / total for k, v in seconds.items()} if total else {},
        "training": {
            k: (last.get("training") or {}).get(k)
            for k in ("examples_per_second", "input_wait_fraction", "precision_policy", "advisor")
        },
        "blessed": last["blessed"],
    }


def window_steps(step_seconds: float, window_seconds: float, minimum: int = 2) -> int:
    """Whole steps that fill ``window_seconds`` at ``step_seconds`` each (at least ``minimum``)."""
    return max(minimum, round(window_seconds / step_seconds))


def trainer_model(
    data: Any,
    config: Any,
    sizes: Sizes,
    window: int,
    name: str,
    *,
    reader_examples_per_second: float | None = None,
) -> dict[str, Any]:
    """One model's contenders side by side; ``reader_examples_per_second`` (the reader alone,
    measured on the same files and config) is the reader's ceiling the advisor row reports."""
    from fullthrottle.bench.trainer import (
        KerasFitBaseline,
        MatmulCeiling,
        OurLoop,
        StrongFit,
        compute_dtype,
        matmul_ceiling,
        training_flops_per_example,
        trimmed_lengths,
    )
    from trainer_module.training.models.transformer import trims_padding

    started = time.perf_counter()
    ours = OurLoop(data, config)
    # The same model and compiled loop as ours, fed from memory (no second build or trace).
    memory = OurLoop(data, config, source="memory", same_model_as=ours)
    baseline = KerasFitBaseline(data, config)
    warm = max(config.steps_per_loop, 2)
    if name == "transformer" and sizes.transformer_warmup_steps:
        warm = max(sizes.transformer_warmup_steps, 2)
    ours.measure(warm)  # tracing
    if name == "transformer" and sizes.transformer_window_seconds:
        step_seconds = ours.batch.global_batch / ours.measure(2)
        window = window_steps(step_seconds, sizes.transformer_window_seconds)
    memory.fill_cache()  # its batches are all in memory before any timed window
    memory.measure(warm)
    baseline.measure(min(window, 20, warm))
    strong_fit = StrongFit(
        data, config, ours, steps_per_execution=min(config.steps_per_loop, window)
    )
    strong_fit.measure(strong_fit.steps_per_execution)  # tracing
    baseline_window = window
    if name == "tabular":
        baseline_window = sizes.tabular_baseline_window_steps or window
    # Ours and in-memory back to back in every repetition, which of them first flipping every
    # rotation (`alternate(side_by_side=...)`): a paired ratio is only as good as the two windows
    # are close in time. With `fit` between them, the tabular paired ratios' middle half spanned
    # ~0.085 (seven runs of 25 pairs); side by side 0.058 (60 pairs). Plain rotation would also
    # put ours right after the matmul ceiling in 3 of 4 repetitions, in-memory in 1.
    contenders = {
        "ours": lambda: ours.measure(window),
        "ours_in_memory": lambda: memory.measure(window),
        "tfx_example": lambda: baseline.measure(baseline_window),
        "strong_fit": lambda: strong_fit.measure(window),
    }
    # The fused-kernel lever, side by side: the same loop with the Transformer's plain Keras
    # layers (training.models.transformer.fused_kernels=False). The tabular model has nothing
    # to fuse.
    kind = config.resolved_model(data.model_inputs)
    options = config.model_options(kind)
    fusable = kind == "transformer" and options.fused_kernels and sizes.fused_vs_unfused
    if fusable:
        unfused = OurLoop(data, config.with_model_options(kind, fused_kernels=False))
        unfused.measure(warm)
        contenders["ours_unfused"] = lambda: unfused.measure(window)
    # Trimming padding, side by side: the same loop computing on every position
    # (training.models.transformer.trim_padding=False). It is also the loop whose MFU is
    # reported: the FLOP count per example is for the full sequence, which only the untrimmed
    # loop computes.
    trims = kind == "transformer" and trims_padding(options, config)
    if trims:
        untrimmed = OurLoop(data, config.with_model_options(kind, trim_padding=False))
        untrimmed.measure(warm)
        contenders["ours_untrimmed"] = lambda: untrimmed.measure(window)
    # The matmul ceiling in ours' compute dtype is a contender too: each repetition's MFU
    # divides by the ceiling measured seconds from its training window, under the same load
    # (measured once after the windows, it moved 849-919 GFLOP/s between runs).
    ceiling_probe = MatmulCeiling(compute_dtype(ours.policy), iterations=sizes.ceiling_iterations)
    contenders["matmul_ceiling"] = ceiling_probe.measure
    repeats = sizes.tabular_repeats if name == "tabular" else sizes.repeats
    warmed = time.perf_counter()
    samples = alternate(contenders, repeats=repeats, side_by_side=("ours", "ours_in_memory"))
    alternated = time.perf_counter()
    # Tabular input efficiency's own pairs (see Sizes.tabular_input_pairs), pooled with the
    # repetitions' pairs: rates are per second, so windows of both lengths compare.
    input_pairs = sizes.tabular_input_pairs if name == "tabular" else 0
    input_samples = {key: list(samples[key]) for key in ("ours", "ours_in_memory")}
    if input_pairs:
        for key, values in _input_pairs(ours, memory, sizes).items():
            input_samples[key] += values
    input_paired = time.perf_counter()
    flops = training_flops_per_example(data, config)
    ceilings = {
        compute_dtype(ours.policy): {
            "dtype": ceiling_probe.dtype.name,
            "size": ceiling_probe.size,
            "iterations": ceiling_probe.iterations,
            "flops_per_second": describe(samples["matmul_ceiling"])["median"],
            "samples": samples["matmul_ceiling"],
            "alternated": True,
        }
    }
    if "float32" not in ceilings:
        ceilings["float32"] = matmul_ceiling("float32", iterations=sizes.ceiling_iterations)
    mfu_contender = "ours_untrimmed" if trims else "ours"
    ours_eps = describe(samples[mfu_contender])["median"]
    base_eps = describe(samples["tfx_example"])["median"]
    ceiling = ceilings[compute_dtype(ours.policy)]["flops_per_second"]
    paired_mfu = [
        eps * flops["training"] / peak
        for eps, peak in zip(samples[mfu_contender], samples["matmul_ceiling"], strict=True)
    ]
    from trainer_module.training.advisor import advise, measurements_from_history
    from trainer_module.training.hardware import device_facts
    from trainer_module.training.inputs import resolve_cache

    steady = [r for r in ours.records[1:]]
    advice = advise(
        measurements_from_history(
            steady,
            global_batch_size=ours.batch.global_batch,
            precision_policy=ours.policy,
            input_cached=resolve_cache(config, data.train_files)[0],
            model_kind=kind,
            reader_examples_per_second=reader_examples_per_second,
        ),
        config,
        device_facts(),
    )
    return {
        "model": name,
        "precision_policy": ours.policy,
        "global_batch_size": ours.batch.global_batch,
        "window_steps": window,
        "baseline_window_steps": baseline_window,
        "vs_tfx_example": ratio_entry(samples, "ours", "tfx_example"),
        "vs_strong_fit": {
            **ratio_entry(samples, "ours", "strong_fit"),
            # What the fairness tests check: the same options, policy and dataset as ours.
            "fit": {
                "policy": strong_fit.policy,
                "steps_per_execution": strong_fit.steps_per_execution,
                "jit_compile": config.jit_compile,
                "same_dataset_object": strong_fit.dataset is ours.dataset,
            },
        },
        "input_efficiency": {
            **ratio_entry(input_samples, "ours", "ours_in_memory"),
            "pairs": {
                "with_every_contender": repeats,
                "side_by_side_only": input_pairs,
                "side_by_side_window_steps": sizes.tabular_input_window_steps
                if input_pairs
                else None,
            },
        },
        **({"fused_vs_unfused": ratio_entry(samples, "ours", "ours_unfused")} if fusable else {}),
        **(
            {
                "trimmed_vs_untrimmed": ratio_entry(samples, "ours", "ours_untrimmed"),
                "trimmed_length": trimmed_lengths(data, config, batches=50),
            }
            if trims
            else {}
        ),
        "flops_per_example": flops,
        "matmul_ceiling": ceilings,
        "mfu": {
            "ours": ours_eps * flops["training"] / ceiling,
            # Per repetition: the window's rate over the ceiling measured next to it.
            "ours_paired_median": statistics.median(paired_mfu),
            "ours_paired_min": min(paired_mfu),
            "ours_paired_max": max(paired_mfu),
            "ours_contender": mfu_contender,
            "ours_ceiling_dtype": compute_dtype(ours.policy),
            "tfx_example": base_eps * flops["training"] / ceilings["float32"]["flops_per_second"],
            "tfx_example_ceiling_dtype": "float32",
        },
        "advisor": advice,
        # Where this benchmark's time went: building and warming the contenders, then the
        # alternated windows (quick mode's budget is mostly the first on a slow machine).
        "phase_seconds": {
            "build_and_warm_up": warmed - started,
            "alternated_windows": alternated - warmed,
            **({"input_efficiency_pairs": input_paired - alternated} if input_pairs else {}),
        },
    }


def _input_pairs(ours: Any, memory: Any, sizes: Sizes) -> dict[str, list[float]]:
    """``sizes.tabular_input_pairs`` pairs of ours and in-memory windows alone, alternated."""
    steps = sizes.tabular_input_window_steps
    return alternate(
        {"ours": lambda: ours.measure(steps), "ours_in_memory": lambda: memory.measure(steps)},
        repeats=sizes.tabular_input_pairs,
    )


def measure_input_pairs(data: Any, config: Any, sizes: Sizes) -> dict[str, Any]:
    """Input efficiency's pairs alone, on a model and input pipelines of this process's own
    (one of ``Sizes.tabular_input_processes``): the same contenders and warm-up as
    :func:`trainer_model`'s, without the other contenders."""
    from fullthrottle.bench.trainer import OurLoop

    started = time.perf_counter()
    ours = OurLoop(data, config)
    memory = OurLoop(data, config, source="memory", same_model_as=ours)
    warm = max(config.steps_per_loop, 2)
    ours.measure(warm)
    memory.fill_cache()
    memory.measure(warm)
    warmed = time.perf_counter()
    samples = _input_pairs(ours, memory, sizes)
    return {
        **samples,
        "phase_seconds": {
            "build_and_warm_up": warmed - started,
            "input_efficiency_pairs": time.perf_counter() - warmed,
        },
    }


def measure_input_runs(
    work: Path, data: Any, config: Any, sizes: Sizes, entry: dict[str, Any], name: str
) -> None:
    """Adds ``sizes.tabular_input_processes`` fresh processes' input-efficiency pairs to
    ``entry`` (the model's result from :func:`measure_model_in_process`), in place."""
    if not sizes.tabular_input_processes:
        return
    started = time.perf_counter()
    try:
        runs = [
            measure_input_pairs_in_process(work, data, config, sizes, name, index)
            for index in range(1, sizes.tabular_input_processes + 1)
        ]
    except RuntimeError as error:
        # The model's own results (tens of minutes of windows) stand; the verdict is then the
        # one process's, and the table's JSON says why the others are missing.
        entry["input_efficiency"]["more_processes_error"] = str(error)
        return
    entry["input_efficiency"] = pool_input_runs(entry["input_efficiency"], runs)
    entry["phase_seconds"]["input_efficiency_processes"] = time.perf_counter() - started


def pool_input_runs(entry: dict[str, Any], runs: list[dict[str, list[float]]]) -> dict[str, Any]:
    """Input efficiency over the model process's pairs (``entry``, a `ratio_entry` of ours vs
    in-memory) and those of ``runs`` (other processes' samples): the ratio over all pairs, and
    each process's own paired median and interval under ``runs``."""
    own = {key: list(entry[key]["values"]) for key in ("ours", "ours_in_memory")}
    per_run = [own] + [{key: list(run[key]) for key in own} for run in runs]
    pooled = {key: [v for run in per_run for v in run[key]] for key in own}
    pairs = {**entry.get("pairs", {}), "more_processes": len(runs)}
    if runs:
        pairs["side_by_side_per_more_process"] = len(runs[0]["ours"])
    return {
        **ratio_entry(pooled, "ours", "ours_in_memory"),
        "pairs": pairs,
        "runs": [
            {
                "pairs": len(run["ours"]),
                **{
                    k: v
                    for k, v in ratio(run, "ours", "ours_in_memory").items()
                    if k in ("ratio", "paired_median", "paired_interval")
                },
            }
            for run in per_run
        ],
    }


def measure_model(data: Any, config: Any, sizes: Sizes, window: int, name: str) -> dict[str, Any]:
    """One model's trainer benchmarks (``trainer_model``) and its reader vs tfx_bsl."""
    from fullthrottle.bench.trainer import reader_rates

    # The reader first: its rate is the ceiling the model's advisor row reports.
    started = time.perf_counter()
    samples = reader_rates(data, config, batches=sizes.reader_batches, repeats=sizes.repeats)
    reader_seconds = time.perf_counter() - started
    entry = trainer_model(
        data,
        config,
        sizes,
        window,
        name,
        reader_examples_per_second=statistics.median(samples["ours"]),
    )
    entry["phase_seconds"]["reader"] = reader_seconds
    per_cpu_second = samples.pop("ours_per_cpu_second")
    reader = ratio_entry(samples, "ours", "tfx_bsl")
    reader["headroom_vs_training"] = (
        reader["ours"]["median"] / entry["vs_tfx_example"]["ours"]["median"]
    )
    reader["ours_per_cpu_second"] = {
        **describe(per_cpu_second),
        "interval": median_interval(per_cpu_second),
    }
    entry["reader_vs_tfx_bsl"] = reader
    if name == "tabular":
        entry["streaming"] = measure_streaming(data, config, sizes)
    return entry


def measure_streaming(data: Any, config: Any, sizes: Sizes) -> dict[str, Any]:
    """Streaming input efficiency and the streaming reader alone, on generated tabular data
    (``Sizes.streaming_rows``) with the model's features: ``cache: false``, files as large as
    a user's big data."""
    from fullthrottle.bench.trainer import reader_rates, streaming_rates, write_prebatched_copies
    from fullthrottle.bench.workloads import streaming_tabular_data
    from trainer_module.training.inputs import resolve_cache

    started = time.perf_counter()
    big = streaming_tabular_data(data, rows=sizes.streaming_rows, files=sizes.streaming_files)
    generated = time.perf_counter()
    auto_cache, why = resolve_cache(dataclasses.replace(config, cache="auto"), big.train_files)
    prebatched_dir = str(Path(big.examples_uri) / "prebatched")
    rates = streaming_rates(
        big,
        config,
        batch_sizes=STREAMING_BATCH_SIZES,
        window_examples=sizes.streaming_window_examples,
        repeats=sizes.streaming_repeats,
        prebatched_dir=prebatched_dir,
    )
    out: dict[str, Any] = {
        "rows": sizes.streaming_rows,
        "examples_uri": big.examples_uri,
        "files": len(big.train_files),
        "bytes": sum(os.path.getsize(f) for f in big.train_files),
        "auto_cache_would_cache": auto_cache,
        "auto_cache_reason": why,
    }
    for batch_size, measured in rates.items():
        out[f"b{batch_size}"] = {
            **ratio_entry(measured["samples"], "streaming", "in_memory"),
            "window_steps": measured["window_steps"],
        }
        out[f"b{batch_size}_prebatched"] = ratio_entry(
            measured["samples"], "prebatched", "in_memory"
        )
    reader_config = dataclasses.replace(config, cache=False, per_replica_batch_size=256)
    # Ours alone: `tf_dataset_factory` is compared on the model's own data above.
    samples = reader_rates(
        big,
        reader_config,
        batches=sizes.reader_batches,
        repeats=sizes.streaming_repeats,
        with_tfx_bsl=False,
    )
    per_cpu_second = samples["ours_per_cpu_second"]
    out["reader"] = {
        "batch_size": 256,
        "examples_per_second": describe(samples["ours"]),
        "per_cpu_second": {**describe(per_cpu_second), "interval": median_interval(per_cpu_second)},
    }
    # The same reader on the pre-batched copies (`training.input_snapshot_dir`, written above
    # by the streaming contender; timed here on their own, from a fresh folder).
    prebatched_config = dataclasses.replace(reader_config, input_snapshot_dir=prebatched_dir)
    rewrite_dir = str(Path(big.examples_uri) / "prebatched-timed")
    if os.path.isdir(rewrite_dir):
        shutil.rmtree(rewrite_dir)
    written = write_prebatched_copies(
        big, dataclasses.replace(reader_config, input_snapshot_dir=rewrite_dir)
    )
    shutil.rmtree(rewrite_dir)
    prebatched_samples = reader_rates(
        big,
        prebatched_config,
        batches=sizes.reader_batches,
        repeats=sizes.streaming_repeats,
        with_tfx_bsl=False,
    )
    per_cpu_second = prebatched_samples["ours_per_cpu_second"]
    out["reader_prebatched"] = {
        "batch_size": 256,
        "examples_per_second": describe(prebatched_samples["ours"]),
        "per_cpu_second": {**describe(per_cpu_second), "interval": median_interval(per_cpu_second)},
        "write_seconds": written["seconds"],
        "bytes": written["bytes"],
    }
    out["phase_seconds"] = {
        "generate_data": generated - started,
        "measure": time.perf_counter() - generated,
    }
    return out


def measure_model_in_process(
    work: Path, data: Any, config: Any, sizes: Sizes, window: int, name: str
) -> dict[str, Any]:
    """:func:`measure_model` in a fresh Python process (``fullthrottle.bench.model_process``).

    A user's Trainer trains one model alone in its process, and so is each model measured: in
    one process the tabular model, measured after the Transformer, ran at 0.93-0.96x input
    efficiency against 0.98-1.01x alone on the same data; whatever the Transformer's contenders
    leave behind (threads, allocator state, traced functions) should not be charged to the next
    model. The request goes by pickle, the result comes back as JSON.
    """
    request = {"data": data, "config": config, "sizes": sizes, "window": window, "name": name}
    return _in_process(work / f"trainer-{name}", request, f"the {name} trainer benchmark process")


def measure_input_pairs_in_process(
    work: Path, data: Any, config: Any, sizes: Sizes, name: str, index: int
) -> dict[str, Any]:
    """:func:`measure_input_pairs` in fresh Python process number ``index`` (1, 2, ...)."""
    request = {"kind": "input_pairs", "data": data, "config": config, "sizes": sizes}
    return _in_process(
        work / f"trainer-{name}-input-{index}",
        request,
        f"the {name} input efficiency process {index}",
    )


def _in_process(job: Path, request: dict[str, Any], what: str) -> dict[str, Any]:
    """Runs ``request`` with ``python -m fullthrottle.bench.model_process job``; its result."""
    job.mkdir(parents=True, exist_ok=True)
    (job / "request.pickle").write_bytes(pickle.dumps(request))
    result_path = job / "result.json"
    result_path.unlink(missing_ok=True)
    # Its own temp folder inside the job folder: the process exits without teardown (see
    # model_process), so what TensorFlow removes at exit (autograph's generated files, ~15 per
    # run) would otherwise stay in the user's temp folder.
    (job / "tmp").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "TMPDIR": str(job / "tmp"),
    }
    command = [sys.executable, "-m", "fullthrottle.bench.model_process", str(job)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    (job / "stderr.log").write_text(done.stderr, encoding="utf-8")
    if done.returncode != 0 or not result_path.exists():
        raise RuntimeError(
            f"{what} exited {done.returncode} (log: {job / 'stderr.log'}): {done.stderr[-2000:]}"
        )
    return json.loads(result_path.read_text(encoding="utf-8"))


def _tabular_mlmd(work: Path, pipeline: dict[str, Any] | None) -> Path:
    """MLMD of the transformed penguins data: the pipeline benchmark's run, or (when that
    benchmark was not selected or failed) a run of the pipeline's prefix up to Transform in
    ``work/tabular``, made once and shared by the trainer and tracking benchmarks."""
    from fullthrottle.bench.workloads import run_transform_prefix, transform_prefix_config
    from fullthrottle.core.config import BeamConfig, DataSpec

    if pipeline and pipeline.get("output_dir"):
        return Path(pipeline["output_dir"]) / "metadata" / "fullthrottle-penguins.sqlite"
    cfg = transform_prefix_config(
        output_dir=str(work / "tabular"), spec=DataSpec(), beam=BeamConfig()
    )
    if not Path(cfg.mlmd_path).exists():
        run_transform_prefix(cfg)
    return Path(cfg.mlmd_path)


def bench_trainer(work: Path, sizes: Sizes, pipeline: dict[str, Any] | None) -> dict[str, Any]:
    """Both models: ours vs the TFX example, input efficiency, MFU, reader vs tfx_bsl."""
    from fullthrottle.bench.workloads import (
        TABULAR_TRAINING,
        TRANSFORMER_DATA,
        TRANSFORMER_TRAINING,
        run_transform_prefix,
        training_data_from_run,
        transform_prefix_config,
    )
    from fullthrottle.core.config import BeamConfig, DataSpec

    results: dict[str, Any] = {}
    tabular = training_data_from_run(str(_tabular_mlmd(work, pipeline)), DataSpec(), name="tabular")
    text_cfg = transform_prefix_config(
        output_dir=str(work / "transformer"),
        spec=TRANSFORMER_DATA,
        beam=BeamConfig(),
        name="fullthrottle-bench-text",
    )
    results["transformer_transform"] = run_transform_prefix(text_cfg)
    text = training_data_from_run(str(text_cfg.mlmd_path), TRANSFORMER_DATA, name="transformer")
    transformer_config = TRANSFORMER_TRAINING.with_model_options(
        "transformer", **sizes.transformer_overrides
    )
    for name, data, config, window in (
        ("transformer", text, transformer_config, sizes.transformer_window_steps),
        ("tabular", tabular, TABULAR_TRAINING, sizes.tabular_window_steps),
    ):
        results[name] = measure_model_in_process(work, data, config, sizes, window, name)
    measure_input_runs(work, tabular, TABULAR_TRAINING, sizes, results["tabular"], "tabular")
    results["data"] = {
        "tabular": {"train_files": list(tabular.train_files)},
        "transformer": {"train_files": list(text.train_files)},
    }
    return results


def bench_tracking(work: Path, sizes: Sizes, pipeline: dict[str, Any] | None) -> dict[str, Any]:
    """MLflow on vs off around the real ``train()`` on the tabular data (the fastest steps, so
    the largest relative cost of per-loop hook work), SQLite store like ``fullthrottle run``."""
    from fullthrottle.bench.trainer import tracking_rates
    from fullthrottle.bench.workloads import TABULAR_TRAINING, training_data_from_run
    from fullthrottle.core.config import DataSpec

    data = training_data_from_run(str(_tabular_mlmd(work, pipeline)), DataSpec(), name="tabular")
    config = dataclasses.replace(TABULAR_TRAINING, train_steps=sizes.tracking_train_steps)
    uri = f"sqlite:///{work / 'mlflow' / 'mlflow.db'}"
    (work / "mlflow").mkdir(parents=True, exist_ok=True)
    measured = tracking_rates(data, config, tracking_uri=uri, repeats=sizes.tracking_repeats)
    entry = ratio_entry(measured["samples"], "on", "off")
    entry["train_reported_examples_per_second"] = measured["train_reported_examples_per_second"]
    entry["train_steps"] = config.train_steps
    # Tracking's own CPU seconds over the same window, per part, as a share of its wall time:
    # a direct figure beside the ratio, which this machine's noise (+-5-8% per sample) blurs.
    if measured["cpu"]:
        entry["tracking_cpu"] = {
            key: describe([c[key] for c in measured["cpu"]])["median"]
            for key in (
                "fraction",
                "direct_fraction",
                "hook",
                "hook_wall",
                "sender",
                "system",
                "wall_seconds",
            )
        }
    return entry


def bench_checkpoints(work: Path, sizes: Sizes, pipeline: dict[str, Any] | None) -> dict[str, Any]:
    """Periodic saves traced vs eager (``training.traced_checkpoint_saves``) around the real
    ``train()`` on the tabular data, whose short steps make the saves' cost visible."""
    if not sizes.checkpoint_repeats:
        return {"skipped": "checkpoint_repeats is 0 (quick mode runs no checkpoint lever)"}
    from fullthrottle.bench.trainer import checkpoint_rates
    from fullthrottle.bench.workloads import TABULAR_TRAINING, training_data_from_run
    from fullthrottle.core.config import DataSpec

    data = training_data_from_run(str(_tabular_mlmd(work, pipeline)), DataSpec(), name="tabular")
    config = dataclasses.replace(TABULAR_TRAINING, train_steps=sizes.checkpoint_train_steps)
    measured = checkpoint_rates(data, config, repeats=sizes.checkpoint_repeats)
    entry = ratio_entry(measured["samples"], "traced", "eager")
    entry["train_steps"] = config.train_steps
    entry["checkpoint_every_steps"] = config.checkpoint_every_steps
    entry["saves"] = measured["saves"]  # as train() reported them: {"traced": ["traced"], ...}
    entry["checkpoint_share"] = {
        name: describe(values)["median"] for name, values in measured["checkpoint_share"].items()
    }
    return entry


def bench_beam(work: Path, sizes: Sizes) -> dict[str, Any]:
    """ExampleGen + Transform rows/s on generated penguins-shaped CSVs, 1 vs 2 DirectRunner
    workers (multi_processing), from MLMD component times. One run per point (each is long)."""
    from fullthrottle.bench.workloads import (
        example_gen_name,
        run_transform_prefix,
        transform_prefix_config,
        write_tabular_csv,
    )
    from fullthrottle.core.config import BeamConfig, DataSpec

    if not sizes.beam_rows:
        return {
            "skipped": "quick mode runs no Beam scaling point (start-up dominates small inputs); "
            "the full mode measures 250k-1M rows with 1 and 2 workers"
        }
    points = []
    for rows in sizes.beam_rows:
        csv_path = write_tabular_csv(work / "beam" / f"rows{rows}" / "data.csv", rows)
        for workers in sizes.beam_workers:
            cfg = transform_prefix_config(
                output_dir=str(work / "beam" / f"rows{rows}-w{workers}"),
                spec=dataclasses.replace(DataSpec(), path=str(csv_path)),
                beam=BeamConfig(direct_running_mode="multi_processing", direct_num_workers=workers),
                name="fullthrottle-bench-beam",
            )
            run = run_transform_prefix(cfg)
            secs = run["component_seconds"]
            gen = example_gen_name(secs)
            work_seconds = secs[gen] + secs["Transform"]
            points.append(
                {
                    "rows": rows,
                    "workers": workers,
                    "example_gen_seconds": secs[gen],
                    "transform_seconds": secs["Transform"],
                    "rows_per_second": rows / work_seconds if work_seconds else None,
                    "prefix_wall_seconds": run["wall_seconds"],
                    "component_seconds": secs,
                }
            )
    by = {(p["rows"], p["workers"]): p for p in points}
    two_vs_one = {
        str(rows): by[(rows, 2)]["rows_per_second"] / by[(rows, 1)]["rows_per_second"]
        for rows in sizes.beam_rows
        if (rows, 1) in by and (rows, 2) in by
    }
    return {"points": points, "two_vs_one_workers": two_vs_one}


def bench_serving(work: Path, sizes: Sizes, pipeline: dict[str, Any] | None) -> dict[str, Any]:
    """`fullthrottle/bench/serving.py: run_serving_benchmark` on the model the pipeline benchmark pushed."""
    try:
        from fullthrottle.bench.serving import run_serving_benchmark
    except ImportError as exc:
        return {"skipped": f"serving benchmark not available: {exc}"}
    from fullthrottle.bench.workloads import raw_eval_examples

    if not (pipeline and pipeline.get("blessed")):
        return {"skipped": "no pushed model (the pipeline benchmark did not push)"}
    out = Path(pipeline["output_dir"])
    last = json.loads((out / "last_run.json").read_text())
    examples = raw_eval_examples(last["pipeline_root"], label="species", limit=64)
    return run_serving_benchmark(
        serving_dir=last["serving_dir"],
        examples=examples,
        model_name=last["model_name"],
        requests=sizes.serving_requests,
        concurrency=sizes.serving_concurrency,
    )


# ------------------------------------------------------------------------------ the suite
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
    sizes: Sizes,
    mode: str,
    work_dir: Path | None = None,
    only: Sequence[str] = BENCHMARKS,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """Runs the selected benchmarks and returns the results document (not written).

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
    pipeline = None
    if "pipeline" in only:
        results["pipeline"] = pipeline = _guarded(
            "pipeline", lambda: bench_pipeline(work, sizes), log
        )
        if "error" in pipeline:
            pipeline = None
    if "trainer" in only:
        results["trainer"] = _guarded("trainer", lambda: bench_trainer(work, sizes, pipeline), log)
    if "tracking" in only:
        results["tracking"] = _guarded(
            "tracking", lambda: bench_tracking(work, sizes, pipeline), log
        )
    if "checkpoints" in only:
        results["checkpoints"] = _guarded(
            "checkpoints", lambda: bench_checkpoints(work, sizes, pipeline), log
        )
    if "beam" in only:
        results["beam"] = _guarded("beam", lambda: bench_beam(work, sizes), log)
    if "serving" in only:
        results["serving"] = _guarded("serving", lambda: bench_serving(work, sizes, pipeline), log)
    document = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": mode,
        "command": "fullthrottle bench" + (" --quick" if mode == "quick" else ""),
        "git_commit": _git_commit(),
        "machine": machine(),
        "sizes": dataclasses.asdict(sizes),
        "suite_seconds": time.perf_counter() - started,
        "work_dir": str(work),
        "results": results,
    }
    document["targets"] = targets(results)
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


def _get(results: dict[str, Any], *path: str) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _conservative_ratio(entry: Any) -> float | None:
    """The lower of the ratio of medians and the median paired ratio (see measure.ratio)."""
    if not isinstance(entry, dict) or entry.get("ratio") is None:
        return None
    return min(entry["ratio"], entry.get("paired_median", entry["ratio"]))


def _lower(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    # The targets judged on a paired ratio (`measure.ratio`), and so also decided or not by its
    # paired median's interval; MFU is judged on its two estimates.
    ratios = {
        "transformer_vs_tfx_example": _get(results, "trainer", "transformer", "vs_tfx_example"),
        "transformer_input_efficiency": _get(results, "trainer", "transformer", "input_efficiency"),
        "tabular_input_efficiency": _get(results, "trainer", "tabular", "input_efficiency"),
        "tracking_on_vs_off": _get(results, "tracking"),
        **{
            f"{model}_vs_strong_fit": _get(results, "trainer", model, "vs_strong_fit")
            for model in ("transformer", "tabular")
        },
        **{
            f"tabular_streaming_b{size}": _get(
                results, "trainer", "tabular", "streaming", f"b{size}"
            )
            for size in STREAMING_BATCH_SIZES
        },
        **{
            f"tabular_streaming_prebatched_b{size}": _get(
                results, "trainer", "tabular", "streaming", f"b{size}_prebatched"
            )
            for size in STREAMING_BATCH_SIZES
        },
    }
    measured = {name: _conservative_ratio(entry) for name, entry in ratios.items()}
    measured["transformer_mfu"] = _lower(
        _get(results, "trainer", "transformer", "mfu", "ours"),
        _get(results, "trainer", "transformer", "mfu", "ours_paired_median"),
    )
    intervals = {
        name: entry.get("paired_interval")
        for name, entry in ratios.items()
        if isinstance(entry, dict)
    }
    # The reader's examples per CPU-second: its windows' median, decided by their interval.
    for name, key in (
        ("tabular_reader_per_core", "reader"),
        ("tabular_reader_prebatched_per_core", "reader_prebatched"),
    ):
        per_core = _get(results, "trainer", "tabular", "streaming", key, "per_cpu_second")
        measured[name] = per_core["median"] if per_core else None
        if per_core:
            intervals[name] = per_core["interval"]
    out = []
    for name, target in TARGETS.items():
        met = None if measured[name] is None else measured[name] >= target
        interval = intervals.get(name)
        entry = {"name": name, "target": target, "measured": measured[name], "met": met}
        if interval is not None and met is not None:
            # Decided when the paired median's interval lies wholly on the verdict's side of the
            # line: a verdict on a median whose interval straddles the line could flip in the
            # next run of the same code. A verdict from fewer pairs than a 90% interval needs
            # (n < 5: quick mode's 3) is undecided too.
            entry["paired_interval"] = interval
            entry["decided"] = interval["coverage"] >= INTERVAL_CONFIDENCE and (
                interval["low"] >= target if met else interval["high"] < target
            )
            # Measured in several processes (Sizes.tabular_input_processes): the interval above
            # covers the noise between windows, not between runs, so each process's own paired
            # median must fall on the verdict's side of the line as well.
            runs = (ratios.get(name) or {}).get("runs") or []
            if len(runs) > 1:
                entry["run_paired_medians"] = [run["paired_median"] for run in runs]
                entry["runs_agree"] = all((run["paired_median"] >= target) == met for run in runs)
                entry["decided"] = entry["decided"] and entry["runs_agree"]
        out.append(entry)
    return out


# ------------------------------------------------------------------------------ the table
def _fmt_ratio(entry: dict[str, Any] | None) -> str:
    if not entry or "ratio" not in entry:
        return "n/a"
    paired = entry.get("paired_median")
    middle = f" (paired median {paired:.2f}x)" if paired is not None else ""
    return f"{entry['ratio']:.2f}x{middle} [{entry['paired_min']:.2f}-{entry['paired_max']:.2f}]"


def _fmt_rate(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "n/a"
    spread = entry.get("spread")
    return f"{entry['median']:,.0f}" + (f" (±{spread / 2:.0%})" if spread is not None else "")


def verdict_text(t: dict[str, Any] | None) -> str:
    """A target's verdict for the table: met or not, and why it is undecided if it is."""
    if not t or t["met"] is None:
        return ""
    text = f">= {t['target']:g}: {'met' if t['met'] else 'NOT met'}"
    interval = t.get("paired_interval")
    if interval is None or t["decided"]:
        return text
    runs = ""
    if t.get("runs_agree") is False:
        medians = ", ".join(f"{m:.3f}" for m in t["run_paired_medians"])
        runs = (
            f"its {len(t['run_paired_medians'])} processes' paired medians ({medians}) "
            "fall on both sides of the line"
        )
    if interval["coverage"] < INTERVAL_CONFIDENCE:
        why = f"too few pairs for a {INTERVAL_CONFIDENCE:.0%} interval of the paired median"
    elif interval["low"] >= t["target"] if t["met"] else interval["high"] < t["target"]:
        # The interval is on the verdict's side of the line: only the processes disagree.
        return f"{text} (undecided: {runs}: the runs differ by more than one run's noise)"
    else:
        if t["target"] < 100:
            what, low, high = (
                "the paired median's",
                f"{interval['low']:.3f}",
                f"{interval['high']:.3f}",
            )
        else:
            what, low, high = "the median's", f"{interval['low']:,.0f}", f"{interval['high']:,.0f}"
        why = f"{what} {interval['coverage']:.0%} interval {low}-{high} contains the line"
        why += f"; {runs}" if runs else ""
    return f"{text} (undecided: {why}; more repetitions would decide)"


def markdown_table(document: dict[str, Any]) -> str:
    """One run's results as Markdown: the run and its machine, then :func:`results_table`."""
    m = document["machine"]
    header = (
        f"results of `fullthrottle bench` ({document['mode']}), {document['date']}, commit {document['git_commit']}\n"
        f"machine: {machine_text(m)}; suite {document['suite_seconds']:.0f} s\n"
    )
    return header + "\n" + results_table(document["results"], document["targets"])


def machine_text(m: dict[str, Any]) -> str:
    """The machine a reading was taken on, as the tables name it."""
    return (
        f"{m['cpu']}, {m['cpu_count']} cores, bf16 {m['cpu_bf16']}, GPUs {m['gpus'] or 'none'}, "
        f"TensorFlow {m['tensorflow']}"
    )


def results_table(results: dict[str, Any], verdicts: list[dict[str, Any]]) -> str:
    """Results as a Markdown table: one row per comparison, ratios first (absolutes are noisy),
    each target's verdict (an entry of :func:`targets`) beside its ratio."""
    r = results
    target_of = {t["name"]: t for t in verdicts}

    def verdict(name: str) -> str:
        return verdict_text(target_of.get(name))

    rows = [
        "| benchmark | contenders (median examples/s, ±half spread) | ratio of medians (paired median) [paired min-max] | target (judged on the lower ratio) |",
        "|---|---|---|---|",
    ]
    for model in ("transformer", "tabular"):
        m = _get(r, "trainer", model)
        if not m or "vs_tfx_example" not in m:
            continue
        v, e, rd = m["vs_tfx_example"], m["input_efficiency"], m.get("reader_vs_tfx_bsl")
        rows.append(
            f"| {model}: ours vs TFX-example `model.fit` ({m['precision_policy']} vs float32) | "
            f"{_fmt_rate(v['ours'])} vs {_fmt_rate(v['tfx_example'])} | {_fmt_ratio(v)} | "
            f"{verdict(f'{model}_vs_tfx_example')} |"
        )
        sf = m.get("vs_strong_fit")
        if sf:
            rows.append(
                f"| {model}: ours vs a strong Keras `fit` (same model options, {sf['fit']['policy']}, "
                f"steps_per_execution {sf['fit']['steps_per_execution']}, jit_compile "
                f"{sf['fit']['jit_compile']}, the same dataset object) | {_fmt_rate(sf['ours'])} vs "
                f"{_fmt_rate(sf['strong_fit'])} | {_fmt_ratio(sf)} | "
                f"{verdict(f'{model}_vs_strong_fit')} |"
            )
        fv = m.get("fused_vs_unfused")
        if fv:
            rows.append(
                f"| {model}: fused kernels on vs off (`training.models.transformer.fused_kernels`) | "
                f"{_fmt_rate(fv['ours'])} vs {_fmt_rate(fv['ours_unfused'])} | {_fmt_ratio(fv)} | |"
            )
        tv = m.get("trimmed_vs_untrimmed")
        if tv:
            tl = m["trimmed_length"]
            rows.append(
                f"| {model}: trim padding on vs off (`training.models.transformer.trim_padding`; batches cut to "
                f"{tl['mean']:.0f} of {tl['full']} tokens on average) | "
                f"{_fmt_rate(tv['ours'])} vs {_fmt_rate(tv['ours_untrimmed'])} | {_fmt_ratio(tv)} | |"
            )
        pairs = f", {len(e['paired'])} pairs" if e.get("pairs", {}).get("side_by_side_only") else ""
        if len(e.get("runs") or []) > 1:
            pairs += f" in {len(e['runs'])} processes"
        rows.append(
            f"| {model}: input efficiency (TFRecord / in-memory batches{pairs}) | "
            f"{_fmt_rate(e['ours'])} vs {_fmt_rate(e['ours_in_memory'])} | {_fmt_ratio(e)} | "
            f"{verdict(f'{model}_input_efficiency')} |"
        )
        mfu = m["mfu"]
        ceiling = m["matmul_ceiling"][mfu["ours_ceiling_dtype"]]["flops_per_second"]
        rows.append(
            f"| {model}: MFU ({m['flops_per_example']['training']:,.0f} FLOP/example; "
            f"{mfu['ours_ceiling_dtype']} matmul ceiling {ceiling / 1e9:.0f} GFLOP/s) | "
            f"ours {mfu['ours']:.1%}"
            + (
                f" (paired median {mfu['ours_paired_median']:.1%}) "
                f"[{mfu['ours_paired_min']:.1%}-{mfu['ours_paired_max']:.1%}]"
                if mfu.get("ours_paired_median") is not None
                else ""
            )
            + f"{' (full-length sequences: trim_padding off)' if mfu.get('ours_contender') == 'ours_untrimmed' else ''}"
            f", TFX example {mfu['tfx_example']:.1%} (float32 ceiling) | | "
            f"{verdict(f'{model}_mfu')} |"
        )
        if rd:
            rows.append(
                f"| {model}: reader alone, ours vs `tf_dataset_factory` | {_fmt_rate(rd['ours'])} vs "
                f"{_fmt_rate(rd['tfx_bsl'])} | {_fmt_ratio(rd)} | headroom over training "
                f"{rd['headroom_vs_training']:.2f}x |"
            )
        st = m.get("streaming")
        if st:
            past = "past" if not st["auto_cache_would_cache"] else "NOT past"
            for size in STREAMING_BATCH_SIZES:
                e = st.get(f"b{size}")
                if e:
                    rows.append(
                        f"| {model}: streaming input efficiency, batch {size} (`cache: false`, "
                        f"{st['rows']:,} generated rows in {st['files']} gzip files, "
                        f"{st['bytes'] / 1e6:,.0f} MB: {past} `cache: auto`'s line; fresh "
                        f"pipeline per window / in-memory batches) | {_fmt_rate(e['streaming'])} vs "
                        f"{_fmt_rate(e['in_memory'])} | {_fmt_ratio(e)} | "
                        f"{verdict(f'{model}_streaming_b{size}')} |"
                    )
                es = st.get(f"b{size}_prebatched")
                if es:
                    rows.append(
                        f"| {model}: the same, streaming from pre-batched copies "
                        f"(`training.input_snapshot_dir`) / in-memory batches, batch {size} | "
                        f"{_fmt_rate(es['prebatched'])} vs {_fmt_rate(es['in_memory'])} | "
                        f"{_fmt_ratio(es)} | "
                        f"{verdict(f'{model}_streaming_prebatched_b{size}')} |"
                    )
            sr = st.get("reader")
            if sr:
                pc = sr["per_cpu_second"]
                rows.append(
                    f"| {model}: streaming reader alone (batch {sr['batch_size']}, fresh pipeline "
                    f"per window), examples/s and examples per CPU-second | "
                    f"{_fmt_rate(sr['examples_per_second'])}; per core {_fmt_rate(pc)} | "
                    f"cores used {sr['examples_per_second']['median'] / pc['median']:.2f} | "
                    f"{verdict(f'{model}_reader_per_core')} |"
                )
            ss = st.get("reader_prebatched")
            if ss:
                pc = ss["per_cpu_second"]
                rows.append(
                    f"| {model}: the same reader on pre-batched copies "
                    f"(`training.input_snapshot_dir`; writing them took {ss['write_seconds']:.1f} s, "
                    f"{ss['bytes'] / 1e6:,.0f} MB) | "
                    f"{_fmt_rate(ss['examples_per_second'])}; per core {_fmt_rate(pc)} | "
                    f"cores used {ss['examples_per_second']['median'] / pc['median']:.2f} | "
                    f"{verdict(f'{model}_reader_prebatched_per_core')} |"
                )
        adv = m.get("advisor")
        if adv:
            knobs = ", ".join(a["field"].split(".", 1)[1] for a in adv["advice"]) or "none"
            limit = ""
            if adv.get("limit"):
                how = "measured" if adv["reader_ceiling_measured"] else "estimated"
                limit = (
                    f"; limit: {adv['limit']} (reader ceiling "
                    f"{adv['reader_ceiling_examples_per_second']:,} examples/s, {how})"
                )
            rows.append(
                f"| {model}: advisor | input wait {adv['input_wait_fraction']:.1%} of "
                f"{adv['step_time_ms']:.2f} ms/step | {adv['classification']}{limit} | "
                f"knobs: {knobs} |"
            )
    t = r.get("tracking")
    if t and "ratio" in t:
        rows.append(
            f"| tracking: MLflow on vs off (real `train()`, tabular, {t['train_steps']} steps) | "
            f"{_fmt_rate(t['on'])} vs {_fmt_rate(t['off'])} | {_fmt_ratio(t)} | {verdict('tracking_on_vs_off')} |"
        )
        c = t.get("tracking_cpu")
        if c:
            rows.append(
                f"| tracking: its own CPU time while training (median of the 'on' runs) | "
                f"{c['fraction']:.2%} of the wall time (hook {c['hook'] * 1e3:.0f} ms, sender "
                f"{c['sender'] * 1e3:.0f} ms, system metrics {c['system'] * 1e3:.0f} ms in "
                f"{c['wall_seconds']:.1f} s)"
                + (
                    f"; direct cost {c['direct_fraction']:.2%} (the hook's wall time on the "
                    f"training thread, {c['hook_wall'] * 1e3:.0f} ms, plus the other threads' CPU)"
                    if c.get("direct_fraction") is not None
                    else ""
                )
                + " | | |"
            )
    k = r.get("checkpoints")
    if k and "ratio" in k:
        share = k["checkpoint_share"]
        rows.append(
            f"| checkpoints: periodic saves traced vs eager (`training.traced_checkpoint_saves`; "
            f"real `train()`, tabular, {k['train_steps']} steps, a save every "
            f"{k['checkpoint_every_steps']}; saves {share['traced']:.1%} vs {share['eager']:.1%} "
            f"of the training time) | {_fmt_rate(k['traced'])} vs {_fmt_rate(k['eager'])} | "
            f"{_fmt_ratio(k)} | |"
        )
    b = r.get("beam")
    if b and "points" in b:
        for p in b["points"]:
            rows.append(
                f"| Beam: ExampleGen + Transform, {p['rows']:,} rows, {p['workers']} worker(s) | "
                f"{p['rows_per_second']:,.0f} rows/s (ExampleGen {p['example_gen_seconds']:.1f} s, "
                f"Transform {p['transform_seconds']:.1f} s) | | |"
            )
        for rows_n, value in b["two_vs_one_workers"].items():
            rows.append(f"| Beam: 2 vs 1 workers, {int(rows_n):,} rows | | {value:.2f}x | |")
    p = r.get("pipeline")
    if p and "component_seconds" in p:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in p["component_seconds"].items())
        rows.append(
            f"| pipeline: `fullthrottle run` on bundled penguins | wall {p['wall_seconds']:.0f} s: {parts} | | |"
        )
    s = r.get("serving")
    if s and "server" in s:
        rows.append(
            f"| serving: REST (`fullthrottle serve`) vs in-process SavedModel | "
            f"{s['server']['requests_per_second']:,.0f} vs {s['in_process']['requests_per_second']:,.0f} req/s "
            f"(p50 {s['server']['p50_ms']:.1f} ms vs {s['in_process']['p50_ms']:.1f} ms) | "
            f"{s['server_vs_in_process']:.2f}x | |"
        )
    switch = (s or {}).get("switch")
    if switch and "rest" in switch:
        rest, grpc = switch["rest"], switch["grpc"]
        rows.append(
            f"| serving: version switch under load, {switch['clients_per_protocol']} REST + "
            f"{switch['clients_per_protocol']} gRPC clients on the `champion` label | "
            f"REST p50 {rest['p50_ms']:.1f} / p99 {rest['p99_ms']:.1f} ms, "
            f"gRPC p50 {grpc['p50_ms']:.1f} / p99 {grpc['p99_ms']:.1f} ms | "
            f"{rest['errors'] + grpc['errors']} failed of {rest['requests'] + grpc['requests']} | |"
        )
    for name, part in r.items():
        if isinstance(part, dict) and "error" in part:
            rows.append(f"| {name}: FAILED | {part['error'][:200]} | | |")
        elif isinstance(part, dict) and "skipped" in part:
            rows.append(f"| {name}: skipped | {part['skipped']} | | |")
    return "\n".join(rows) + "\n"


# ------------------------------------------------------------------------------ results files
# `<results>/LATEST.json`: the newest reading of each benchmark across runs, each with where it
# came from; `LATEST.md` is rendered from it. They are the results the docs show.
LATEST = "LATEST"
# The docs page that shows LATEST.md, between these two lines (`embed_latest`).
DOCS_PAGE = REPO / "docs" / "performance.md"
DOCS_BEGIN = "<!-- begin bench/results/LATEST.md: written by `fullthrottle bench`, do not edit -->"
DOCS_END = "<!-- end bench/results/LATEST.md -->"


def write_results(document: dict[str, Any], results_dir: Path) -> tuple[Path, Path]:
    """``<results_dir>/<timestamp>.json`` and ``.md`` (never overwriting an existing result),
    then ``LATEST.json`` and ``LATEST.md`` updated with this run's readings (:func:`update_latest`).
    Returns the run's two files."""
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = document["date"].replace(":", "").replace("+0000", "Z")
    stem = stamp
    n = 1
    while (results_dir / f"{stem}.json").exists():
        n += 1
        stem = f"{stamp}-{n}"
    json_path, md_path = results_dir / f"{stem}.json", results_dir / f"{stem}.md"
    json_path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    md_path.write_text(markdown_table(document), encoding="utf-8")
    update_latest(results_dir, document, results_file=stem)
    return json_path, md_path


def merge_latest(
    latest: dict[str, Any] | None, document: dict[str, Any], *, results_file: str
) -> dict[str, Any]:
    """``latest`` (a ``LATEST.json`` document, or None) with the readings of one run's
    ``document`` (written as ``<results_file>.json``) in place of the earlier ones.

    A benchmark the run did not select keeps its earlier reading; one it skipped (quick mode's
    Beam scaling and checkpoint lever) is no reading and keeps it too; one that failed is the
    newest reading of that benchmark, and replaces it. A quick run's reading never replaces a
    full run's (quick windows are a smoke test, not a measurement to publish). Each benchmark's
    ``provenance`` names the run it came from; the targets are judged again over the merged
    results.
    """
    results = dict(latest["results"]) if latest else {}
    provenance = dict(latest["provenance"]) if latest else {}
    for name, part in document["results"].items():
        if isinstance(part, dict) and "skipped" in part:
            continue
        if document["mode"] == "quick" and provenance.get(name, {}).get("mode") == "full":
            continue
        results[name] = part
        provenance[name] = {
            "results_file": results_file,
            "date": document["date"],
            "mode": document["mode"],
            "command": document["command"],
            "git_commit": document["git_commit"],
            "machine": document["machine"],
        }
    order = [name for name in BENCHMARKS if name in results]
    order += sorted(set(results) - set(order))
    merged = {name: results[name] for name in order}
    return {
        "results": merged,
        "provenance": {name: provenance[name] for name in order},
        "targets": targets(merged),
    }


def latest_markdown(latest: dict[str, Any]) -> str:
    """``LATEST.md``: which run each benchmark's reading comes from, then :func:`results_table`."""
    rows = [
        "latest reading of each benchmark of `fullthrottle bench` (bench/results/LATEST.json)",
        "",
        "| benchmark | results file | mode | commit | finished (UTC) | seconds | machine |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, source in latest["provenance"].items():
        seconds = latest["results"][name].get("bench_seconds")
        rows.append(
            f"| {name} | {source['results_file']} | {source['mode']} | {source['git_commit']} | "
            f"{source['date']} | {'' if seconds is None else f'{seconds:.0f}'} | "
            f"{machine_text(source['machine'])} |"
        )
    return "\n".join(rows) + "\n\n" + results_table(latest["results"], latest["targets"])


def update_latest(
    results_dir: Path, document: dict[str, Any], *, results_file: str
) -> tuple[Path, Path]:
    """Merges ``document`` into ``<results_dir>/LATEST.json`` (:func:`merge_latest`) and renders
    ``LATEST.md`` from the file as written. Returns both paths."""
    json_path, md_path = results_dir / f"{LATEST}.json", results_dir / f"{LATEST}.md"
    earlier = json.loads(json_path.read_text(encoding="utf-8")) if json_path.exists() else None
    latest = merge_latest(earlier, document, results_file=results_file)
    _replace(json_path, json.dumps(latest, indent=2, default=str) + "\n")
    # Rendered from the JSON as read back, so LATEST.md is exactly what its JSON renders to.
    _replace(md_path, latest_markdown(json.loads(json_path.read_text(encoding="utf-8"))))
    return json_path, md_path


def embed_latest(page: str, latest_md: str) -> str:
    """``page`` (Markdown) with the text between its ``DOCS_BEGIN`` and ``DOCS_END`` lines
    replaced by ``latest_md`` (``LATEST.md``'s text)."""
    begin, end = page.find(DOCS_BEGIN), page.find(DOCS_END)
    if begin < 0 or end < begin:
        raise ValueError(
            f"the page has no generated block: it needs a line {DOCS_BEGIN!r} and, after it, "
            f"a line {DOCS_END!r}"
        )
    # Blank lines around the table: a Markdown table runs on into the next line otherwise.
    return page[: begin + len(DOCS_BEGIN)] + "\n\n" + latest_md + "\n" + page[end:]


def _replace(path: Path, text: str) -> None:
    """Writes ``path`` whole or not at all (a ``.tmp`` sibling renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
