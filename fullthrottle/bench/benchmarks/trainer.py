"""The trainer benchmark: both models (the Transformer on the bundled text, the tabular model
on the penguins data), each in a process of its own (``fullthrottle/bench/model_process.py``):
ours vs the TFX-example ``model.fit`` and a strong ``fit``, our levers, input efficiency, MFU,
the reader alone, the advisor; for the tabular model also streaming input on generated data
past the cache line. Contenders are in ``fullthrottle/bench/trainer.py``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullthrottle.bench.benchmarks.base import (
    BenchmarkSpec,
    Context,
    Reading,
    Target,
    Verdict,
    entry_at,
    fmt_rate,
    rate_reading,
    ratio_entry,
    ratio_reading,
    ratio_row,
    size,
)
from fullthrottle.bench.measure import median_interval, ratio
from fullthrottle.bench.model_process import STREAMING_BATCH_SIZES, run_in_process

NAME = "trainer"
MODELS = ("transformer", "tabular")


@dataclass(frozen=True)
class TrainerSizes:
    repeats: int = size(
        5, "Transformer repetitions (every contender once each); reader repetitions"
    )
    # Tabular windows are ~1.1 s: more of them cost little and steady the paired median. On a
    # shared 2-core machine the same code gave paired ratios anywhere in 0.93-1.00 with 5;
    # paired medians of 0.959-1.003 over nine runs with 15 (about one pair in ten below 0.9,
    # when the machine's state flipped between its two windows); 0.953-1.016 over seven with 25.
    tabular_repeats: int = size(40, "tabular repetitions")
    transformer_window_steps: int = size(50, "steps per Transformer window")
    # The bundled text's training split (~800 rows) fits in one shuffle window (10,000 rows),
    # so a streamed epoch never left the reader's first buffer; repeated to this many windows
    # the reader fills, permutes and drains windows as it does on large text.
    transformer_shuffle_windows: int = size(
        4, "the Transformer's training records repeated to this many shuffle windows"
    )
    # When set, the Transformer's windows are this many seconds of ours instead (steps from
    # ours' step time measured after its warm-up; at least 2): a float32 step took 0.47 s on an
    # AVX2-only EPYC and a bf16 step 0.08 s on an AVX512_BF16 one, so a fixed step count cannot
    # keep quick mode under 5 minutes on both.
    transformer_window_seconds: float | None = size(
        None,
        "when set, Transformer windows are this many seconds of ours instead (at least 2 steps)",
    )
    # Steps each Transformer contender runs before its windows (None = one loop of the config's
    # steps_per_loop, as for the tabular model, whose 50 steps take ~20 ms). The first step
    # traces the loop. Quick mode takes 3: at 0.47 s per float32 step (AMD EPYC without
    # AVX512), cutting four contenders' 50-step warm-ups to 3 took the quick suite from 620 to
    # 498 s.
    transformer_warmup_steps: int | None = size(
        None, "warm-up steps per Transformer contender (– = one loop of `steps_per_loop`)"
    )
    # Tabular steps take ~0.22 ms: 5,000 steps are ~1.1 s per window (1,000 steps swung +-10%).
    tabular_window_steps: int = size(5000, "steps per tabular window")
    # The tabular `fit` baseline's window (None = tabular_window_steps): at ~75k examples/s its
    # 5,000 steps took ~4.3 s of each repetition; its ratio (~4-5x, no target on it) needs no
    # more, and half of it pays for the extra repetitions above.
    tabular_baseline_window_steps: int | None = size(2500, "steps per tabular `fit` window")
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
    # paired median falls on its side of the line too (`verdicts.judge`).
    tabular_input_pairs: int = size(40, "tabular input efficiency's own pairs per process")
    tabular_input_window_steps: int = size(2000, "steps per window of those pairs")
    tabular_input_processes: int = size(2, "fresh processes taking as many pairs again")
    # The fused-kernels lever, side by side (Transformer only; no target rides on it). Quick mode
    # leaves it out: its build, tracing and windows were an estimated ~12 s (not measured on
    # their own) of a 292 s quick suite on the AVX2-only EPYC.
    fused_vs_unfused: bool = size(True, "the fused-kernels row")
    # Square 2048 matmuls chained per ceiling measurement (one per repetition and model): 10
    # took 1.5 s in float32 on the AVX2-only EPYC (113 GFLOP/s), 0.2 s in bf16 on the
    # AVX512_BF16 one. Quick mode chains 4 (0.6 s there): 8 measurements, ~7 s of its budget.
    ceiling_iterations: int = size(10, "chained 2048 x 2048 matmuls per ceiling measurement")
    reader_batches: int = size(400, "batches per reader window")
    # Streaming input efficiency (tabular): generated rows, once, kept in a cache folder
    # (`workloads.streaming_tabular_data`). 6.4M rows are ~180 MB of gzip files, past
    # `cache: auto`'s line on a 24 GiB machine (10% of RAM / 20); quick mode's 300k are not,
    # and its streaming contender still reads with `cache: false`. In quick mode, 3 pairs of
    # 100k-example windows per batch size, with the pre-batched contender and both reader rows,
    # took 32 s of a 422 s quick suite on a shared 2-core machine at load average ~4.8; 2
    # pairs of 60k take about half.
    streaming_rows: int = size(
        6_400_000, "generated tabular rows for streaming input efficiency and the streaming reader"
    )
    streaming_files: int = size(8, "gzip files they are written to")
    streaming_repeats: int = size(
        7, "streaming / in-memory pairs per batch size; streaming reader windows"
    )
    streaming_window_examples: int = size(1_000_000, "examples per streaming and in-memory window")
    # Options of the Transformer benchmark's model (`training.models.transformer`), e.g. d_model.
    transformer_overrides: dict[str, Any] = size({}, "options of the Transformer's model")


# Quick mode (< 5 minutes on 2 shared cores): the same contenders, less of each. Transformer
# windows are ~1.5 s of ours. On an AVX2-only EPYC the suite took 290 s (5:01 for the command)
# with 3 tracking pairs and 10-matmul ceilings, 280 s (4:52) with 2 pairs and 4 matmuls; a
# tabular `fit` window of 500 steps instead of 1,000 (its ratio is ~5x, no target) saves ~1.4 s
# a repetition more.
QUICK = TrainerSizes(
    repeats=3,
    tabular_repeats=5,
    transformer_window_steps=10,
    fused_vs_unfused=False,
    transformer_window_seconds=1.5,
    transformer_warmup_steps=3,
    tabular_window_steps=2000,
    tabular_baseline_window_steps=500,
    reader_batches=200,
    tabular_input_pairs=0,
    tabular_input_processes=0,
    ceiling_iterations=4,
    streaming_rows=300_000,
    streaming_files=4,
    streaming_repeats=2,
    streaming_window_examples=60_000,
)


# ----------------------------------------------------------------------------- measuring
def run(context: Context, sizes: TrainerSizes) -> dict[str, Any]:
    """Both models, each in its own process; then the tabular model's input efficiency in
    ``sizes.tabular_input_processes`` more."""
    from fullthrottle.bench.workloads import (
        TABULAR_TRAINING,
        TRANSFORMER_DATA,
        TRANSFORMER_TRAINING,
        repeated_training_data,
        run_transform_prefix,
        training_data_from_run,
        transform_prefix_config,
    )
    from fullthrottle.core.config import BeamConfig

    work = context.work
    results: dict[str, Any] = {}
    tabular = context.tabular_data()
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
    text, text_rows, text_split_rows = repeated_training_data(
        text,
        min_rows=sizes.transformer_shuffle_windows * transformer_config.shuffle_buffer_size,
        files=len(text.train_files),
        directory=work / "transformer-repeated",
    )
    for name, data, config, window in (
        ("transformer", text, transformer_config, sizes.transformer_window_steps),
        ("tabular", tabular, TABULAR_TRAINING, sizes.tabular_window_steps),
    ):
        results[name] = measure_model_in_process(work, data, config, sizes, window, name)
    results["transformer"]["input_rows"] = {
        "rows": text_rows,
        "split_rows": text_split_rows,
        "shuffle_buffer_size": transformer_config.shuffle_buffer_size,
    }
    measure_input_runs(work, tabular, TABULAR_TRAINING, sizes, results["tabular"], "tabular")
    results["data"] = {
        "tabular": {"train_files": list(tabular.train_files)},
        "transformer": {"train_files": list(text.train_files)},
    }
    return results


def measure_model_in_process(
    work: Path, data: Any, config: Any, sizes: TrainerSizes, window: int, name: str
) -> dict[str, Any]:
    """``model_process.measure_model`` in a fresh Python process. In one process the tabular
    model, measured after the Transformer, ran at 0.93-0.96x input efficiency against
    0.98-1.01x alone on the same data."""
    request = {"data": data, "config": config, "sizes": sizes, "window": window, "name": name}
    return run_in_process(
        work / f"trainer-{name}", request, f"the {name} trainer benchmark process"
    )


def measure_input_pairs_in_process(
    work: Path, data: Any, config: Any, sizes: TrainerSizes, name: str, index: int
) -> dict[str, Any]:
    """``model_process.measure_input_pairs`` in fresh Python process number ``index``."""
    request = {"kind": "input_pairs", "data": data, "config": config, "sizes": sizes}
    return run_in_process(
        work / f"trainer-{name}-input-{index}",
        request,
        f"the {name} input efficiency process {index}",
    )


def measure_input_runs(
    work: Path, data: Any, config: Any, sizes: TrainerSizes, entry: dict[str, Any], name: str
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
        **({"input_cached": entry["input_cached"]} if "input_cached" in entry else {}),
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


# ----------------------------------------------------------------------------- targets
# Where a model's result keeps the samples of the contender its MFU is computed from.
_MFU_CONTENDER_ROWS = {"ours": "vs_tfx_example", "ours_untrimmed": "trimmed_vs_untrimmed"}


def mfu_paired(m: Mapping[str, Any]) -> list[float] | None:
    """A model's MFU per repetition: each window's rate over the ceiling measured next to it
    (``mfu.ours_paired``; for readings from before it was recorded, recomputed from the
    contender's and the ceiling's samples, which are in repetition order). None when the
    result holds neither."""
    mfu = m.get("mfu") or {}
    if mfu.get("ours_paired"):
        return [float(v) for v in mfu["ours_paired"]]
    contender = mfu.get("ours_contender")
    rates = entry_at(m, _MFU_CONTENDER_ROWS.get(contender, ""), contender or "", "values")
    ceilings = entry_at(m, "matmul_ceiling", mfu.get("ours_ceiling_dtype") or "", "samples")
    flops = entry_at(m, "flops_per_example", "training")
    if not rates or not ceilings or not flops or len(rates) != len(ceilings):
        return None
    return [rate * flops / peak for rate, peak in zip(rates, ceilings, strict=True)]


def _mfu_reading(model: str):
    """MFU: the lower of ours' rate over the ceiling's median and the paired median (each
    window over the ceiling measured next to it), decided by the paired median's interval."""

    def read(result: Mapping[str, Any]) -> Reading | None:
        m = entry_at(result, model) or {}
        mfu = m.get("mfu") or {}
        known = [v for v in (mfu.get("ours"), mfu.get("ours_paired_median")) if v is not None]
        if not known:
            return None
        paired = mfu_paired(m)
        return Reading(value=min(known), interval=median_interval(paired) if paired else None)

    return read


_STREAMING_DATA = (
    "ours reading generated files past the cache line with `cache: false`, a fresh pipeline "
    "per window / in-memory batches"
)
TARGETS = (
    Target(
        "transformer_vs_tfx_example",
        2.0,
        "Transformer examples/s, ours / the TFX-example `model.fit`",
        ratio_reading("transformer", "vs_tfx_example"),
    ),
    Target(
        "transformer_vs_strong_fit",
        1.0,
        "Transformer examples/s, ours / a strong Keras `fit`: our loop's own merit",
        ratio_reading("transformer", "vs_strong_fit"),
    ),
    Target(
        "tabular_vs_strong_fit",
        1.0,
        "the same for the tabular model",
        ratio_reading("tabular", "vs_strong_fit"),
    ),
    Target(
        "transformer_mfu",
        0.70,
        "ours' model FLOPs utilization (the lower of the ratio of medians and the paired "
        "median), decided by the paired median's interval",
        _mfu_reading("transformer"),
    ),
    Target(
        "transformer_input_efficiency",
        0.97,
        "ours from its streaming TFRecord input (`cache: false`) / ours from in-memory batches",
        ratio_reading("transformer", "input_efficiency"),
    ),
    Target(
        "tabular_input_efficiency",
        0.97,
        "ours from its input as `make run` reads it (`cache: auto`: cached) / in-memory "
        "batches, over 3 processes",
        ratio_reading("tabular", "input_efficiency"),
    ),
    *(
        Target(
            f"tabular_streaming_b{batch}",
            0.9,
            f"streaming input efficiency at batch {batch}: {_STREAMING_DATA}",
            ratio_reading("tabular", "streaming", f"b{batch}"),
        )
        for batch in STREAMING_BATCH_SIZES
    ),
    *(
        Target(
            f"tabular_streaming_prebatched_b{batch}",
            0.9,
            f"the same at batch {batch}, streaming from pre-batched copies of the files "
            "(`training.input_snapshot_dir`)",
            ratio_reading("tabular", "streaming", f"b{batch}_prebatched"),
        )
        for batch in STREAMING_BATCH_SIZES
    ),
    Target(
        "tabular_reader_per_core",
        400_000,
        "the streaming reader alone, tabular examples per CPU-second (all threads' CPU time), "
        "a fresh pipeline per window; judged on the windows' median and its interval",
        rate_reading("tabular", "streaming", "reader", "per_cpu_second"),
    ),
    Target(
        "tabular_reader_prebatched_per_core",
        400_000,
        "the same reader on the pre-batched copies",
        rate_reading("tabular", "streaming", "reader_prebatched", "per_cpu_second"),
    ),
)


# ----------------------------------------------------------------------------- rows
def rows(result: Mapping[str, Any], verdict: Verdict) -> list[str]:
    out: list[str] = []
    for model in MODELS:
        m = result.get(model)
        if m and "vs_tfx_example" in m:
            out += model_rows(model, m, verdict)
    return out


def _fit_distribution(fit: Mapping[str, Any]) -> str:
    """How `fit` got its batches next to ours (readings before the field: `fit` through
    `experimental_distribute_dataset`, ours without: not equal terms, and said so)."""
    distribution = fit.get("distribution")
    if distribution is None:
        return "; `fit` through OneDeviceStrategy's distributed dataset, ours direct"
    if distribution == "direct":
        return ", both iterating it directly"
    return f", both through {distribution}"


def model_rows(model: str, m: Mapping[str, Any], verdict: Verdict) -> list[str]:
    v, e, rd = m["vs_tfx_example"], m["input_efficiency"], m.get("reader_vs_tfx_bsl")
    rows = [
        ratio_row(
            f"{model}: ours vs TFX-example `model.fit` ({m['precision_policy']} vs float32)",
            v,
            verdict(f"{model}_vs_tfx_example"),
        )
    ]
    sf = m.get("vs_strong_fit")
    if sf:
        fit = sf["fit"]
        rows.append(
            ratio_row(
                f"{model}: ours vs a strong Keras `fit` (same model options, {fit['policy']}, "
                f"steps_per_execution {fit['steps_per_execution']}, jit_compile "
                f"{fit['jit_compile']}, the same dataset object{_fit_distribution(fit)})",
                sf,
                verdict(f"{model}_vs_strong_fit"),
            )
        )
    fv = m.get("fused_vs_unfused")
    if fv:
        rows.append(
            ratio_row(
                f"{model}: fused kernels on vs off (`training.models.transformer.fused_kernels`)",
                fv,
            )
        )
    tv = m.get("trimmed_vs_untrimmed")
    if tv:
        tl = m["trimmed_length"]
        rows.append(
            ratio_row(
                f"{model}: trim padding on vs off (`training.models.transformer.trim_padding`; "
                f"batches cut to {tl['mean']:.0f} of {tl['full']} tokens on average)",
                tv,
            )
        )
    pairs = f", {len(e['paired'])} pairs" if e.get("pairs", {}).get("side_by_side_only") else ""
    if len(e.get("runs") or []) > 1:
        pairs += f" in {len(e['runs'])} processes"
    # A cache row: ours read `cache: auto`'s in-memory copy, so both contenders read memory.
    # Readings from before the field: the tabular workload (penguins, `cache: auto`) always
    # was one, the Transformer's (`cache: false`) never.
    cached = e.get("input_cached", model == "tabular")
    source = "cache row: ours from `cache: auto`'s in-memory copy" if cached else "TFRecord"
    read = m.get("input_rows")
    if read and not cached:
        source += (
            f", {read['rows']:,} rows (the {read['split_rows']:,}-row split repeated) through "
            f"{read['shuffle_buffer_size']:,}-row shuffle windows"
        )
    rows.append(
        ratio_row(
            f"{model}: input efficiency ({source} / in-memory batches{pairs})",
            e,
            verdict(f"{model}_input_efficiency"),
        )
    )
    mfu = m["mfu"]
    ceiling = m["matmul_ceiling"][mfu["ours_ceiling_dtype"]]["flops_per_second"]
    paired = (
        f" (paired median {mfu['ours_paired_median']:.1%}) "
        f"[{mfu['ours_paired_min']:.1%}-{mfu['ours_paired_max']:.1%}]"
        if mfu.get("ours_paired_median") is not None
        else ""
    )
    untrimmed = (
        " (full-length sequences: trim_padding off)"
        if mfu.get("ours_contender") == "ours_untrimmed"
        else ""
    )
    rows.append(
        f"| {model}: MFU ({m['flops_per_example']['training']:,.0f} FLOP/example; "
        f"{mfu['ours_ceiling_dtype']} matmul ceiling {ceiling / 1e9:.0f} GFLOP/s) | "
        f"ours {mfu['ours']:.1%}{paired}{untrimmed}, TFX example {mfu['tfx_example']:.1%} "
        f"(float32 ceiling) | | {verdict(f'{model}_mfu')} |"
    )
    if rd:
        rows.append(
            ratio_row(
                f"{model}: reader alone, ours vs `tf_dataset_factory`"
                + (" (cache row: ours slices its in-memory copy)" if cached else ""),
                rd,
                f"headroom over training {rd['headroom_vs_training']:.2f}x",
            )
        )
    st = m.get("streaming")
    if st:
        rows += _streaming_rows(model, st, verdict)
    adv = m.get("advisor")
    if adv:
        knobs = ", ".join(a["field"].split(".", 1)[1] for a in adv["advice"]) or "none"
        limit = ""
        if adv.get("limit"):
            how = "measured" if adv["reader_ceiling_measured"] else "estimated"
            ceiling = adv["reader_ceiling_examples_per_second"]
            limit = f"; limit: {adv['limit']}" + (
                f" (reader ceiling {ceiling:,} examples/s, {how})" if ceiling is not None else ""
            )
        rows.append(
            f"| {model}: advisor | input wait {adv['input_wait_fraction']:.1%} of "
            f"{adv['step_time_ms']:.2f} ms/step | {adv['classification']}{limit} | "
            f"knobs: {knobs} |"
        )
    return rows


def _reader_row(title: str, reader: Mapping[str, Any], verdict: str) -> str:
    rate, per_core = reader["examples_per_second"], reader["per_cpu_second"]
    return (
        f"| {title} | {fmt_rate(rate)}; per core {fmt_rate(per_core)} | "
        f"cores used {rate['median'] / per_core['median']:.2f} | {verdict} |"
    )


COPIES_EPOCHS = (1, 10)  # runs the copies' row states its write pass over


def copies_cost(
    st: Mapping[str, Any], plain: Mapping[str, Any] | None, copies: Mapping[str, Any]
) -> str:
    """The write pass in the copies' ratio: streaming from copies / in-memory over runs of
    `COPIES_EPOCHS` epochs of the generated rows, the write pass included, and the epochs after
    which the copies beat plain streaming (the advisor's rule, `copies_break_even`)."""
    from trainer_module.training.advisor import copies_break_even

    reader = st.get("reader_prebatched") or {}
    write = reader.get("write_seconds")
    memory = copies.get("in_memory", {}).get("median")
    fast = copies.get("prebatched", {}).get("median")
    if write is None or not memory or not fast:
        return ""
    rows = st["rows"]
    over = ", ".join(
        f"{epochs} epoch{'s' if epochs > 1 else ''} "
        f"{epochs * rows / memory / (write + epochs * rows / fast):.2f}x"
        for epochs in COPIES_EPOCHS
    )
    slow = (plain or {}).get("streaming", {}).get("median")
    even = (
        copies_break_even(
            {
                "rows": rows,
                "write_seconds": write,
                "streaming_examples_per_second": slow,
                "copies_examples_per_second": fast,
            }
        )
        if slow
        else None
    )
    paid = (
        f"; paid back vs plain streaming after {even:.1f} epochs"
        if even
        else ("; never paid back vs plain streaming" if slow else "")
    )
    return f"; with the {write:.1f} s write pass over {rows:,} rows: {over}{paid}"


def cpu_note(entry: Mapping[str, Any], name: str) -> str:
    """The cores ``name`` and the in-memory contender used (medians over their windows), the
    whole machine's meanwhile, and their CPU per example; "" for a reading without them."""
    cpu = entry.get("cpu") or {}
    ours, memory = cpu.get(name), cpu.get("in_memory")
    if not ours or not memory:
        return ""

    def median(values: Mapping[str, Any], metric: str) -> float | None:
        return (values.get(metric) or {}).get("median")

    note = (
        f"; cores {median(ours, 'cores'):.2f} vs {median(memory, 'cores'):.2f}, "
        f"CPU {median(ours, 'cpu_us_per_example'):.2f} vs "
        f"{median(memory, 'cpu_us_per_example'):.2f} us/example"
    )
    machine = median(ours, "machine_cores")
    return note + (f", the machine's {machine:.2f} cores busy" if machine is not None else "")


def _streaming_rows(model: str, st: Mapping[str, Any], verdict: Verdict) -> list[str]:
    rows = []
    past = "past" if not st["auto_cache_would_cache"] else "NOT past"
    for size_ in STREAMING_BATCH_SIZES:
        e = st.get(f"b{size_}")
        if e:
            rows.append(
                ratio_row(
                    f"{model}: streaming input efficiency, batch {size_} (`cache: false`, "
                    f"{st['rows']:,} generated rows in {st['files']} gzip files, "
                    f"{st['bytes'] / 1e6:,.0f} MB: {past} `cache: auto`'s line; fresh "
                    f"pipeline per window / in-memory batches{cpu_note(e, 'streaming')})",
                    e,
                    verdict(f"{model}_streaming_b{size_}"),
                )
            )
        es = st.get(f"b{size_}_prebatched")
        if es:
            rows.append(
                ratio_row(
                    f"{model}: the same, streaming from pre-batched copies "
                    f"(`training.input_snapshot_dir`) / in-memory batches, batch {size_}"
                    f"{copies_cost(st, e, es)}{cpu_note(es, 'prebatched')}",
                    es,
                    verdict(f"{model}_streaming_prebatched_b{size_}"),
                )
            )
    if st.get("reader"):
        rows.append(
            _reader_row(
                f"{model}: streaming reader alone (batch {st['reader']['batch_size']}, fresh "
                "pipeline per window), examples/s and examples per CPU-second",
                st["reader"],
                verdict(f"{model}_reader_per_core"),
            )
        )
    ss = st.get("reader_prebatched")
    if ss:
        rows.append(
            _reader_row(
                f"{model}: the same reader on pre-batched copies (`training.input_snapshot_dir`; "
                f"writing them took {ss['write_seconds']:.1f} s, {ss['bytes'] / 1e6:,.0f} MB)",
                ss,
                verdict(f"{model}_reader_prebatched_per_core"),
            )
        )
    return rows


BENCHMARK = BenchmarkSpec(
    name=NAME,
    summary="both models: ours vs the TFX example and a strong `fit`, levers, input "
    "efficiency, MFU, the reader, streaming past the cache line, the advisor",
    run=run,
    rows=rows,
    full=TrainerSizes(),
    quick=QUICK,
    targets=TARGETS,
)
