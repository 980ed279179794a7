"""The step-time advisor: is this training run waiting on its input, and what to change.

Owns: splitting a run's step time into input wait and compute (from the loop records the
controller already keeps), classifying it in TensorFlow profiler's bands — not input-bound
(< 5% of step time waiting), moderately (5-20%), highly (>= 20%) — and turning that into advice
that names our config fields. The host's work between the loops (metric reads, summaries,
hooks, periodic checkpoints) is measured too; checkpoints taking >= 5% of the training time (and
>= 1 s over the run) get a cadence that brings them to ~2%, with the steps a killed run would
then train again. :func:`advise` is a pure function of the measurements, the config and the
device facts; :func:`advise_result` asks ``hardware.device_facts`` about this machine unless
told.

A lever that changes speed (precision, ``jit_compile``, a model's own options, pre-batched
copies) is advised only where the benchmark measured it faster for that model and precision on
that kind of device, and its advice quotes that figure: the figures are
``bench_figures.json`` beside this module, which ``fullthrottle bench`` writes from
``bench/results/LATEST.json`` (the Trainer runs from an installed package, where
``bench/results`` is not). A lever without such a figure, or measured no faster, is not
advised. Never ``jit_compile`` with the Transformer's padding trimming (XLA turns trimming
off); never a precision the device cannot use (no ``mixed_bfloat16`` on a CPU without
AVX512_BF16/AMX-BF16, no ``mixed_float16`` without a GPU of compute capability >= 7.0).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer_module.training import metrics
from trainer_module.training.config import TrainingConfig
from trainer_module.training.hardware import DeviceFacts, device_facts
from trainer_module.training.models import MODELS
from trainer_module.training.results import TrainResult

# TensorFlow profiler's input-pipeline analyser uses the same bands.
MODERATE_INPUT_WAIT = 0.05
HIGH_INPUT_WAIT = 0.20
NOT_INPUT_BOUND = "not input-bound"
MODERATELY_INPUT_BOUND = "moderately input-bound"
HIGHLY_INPUT_BOUND = "highly input-bound"

# Below this step time the fixed per-step and per-loop costs (dispatch, the loop's host sync,
# the controller's bookkeeping) are a visible share of the step.
SMALL_STEP_SECONDS = 0.005
SMALL_LOOP_STEPS = 200
# Periodic checkpoints are advised against when they take at least this share of the training
# time (loops + the host's work between them), and the suggested cadence brings them to about
# CHECKPOINT_TARGET_SHARE. Measured on 2 CPU cores: the default (every 100 steps) took 29% of a
# tabular run's time (12.5 ms per save against 0.3 ms steps).
CHECKPOINT_SHARE = 0.05
CHECKPOINT_TARGET_SHARE = 0.02
# ... and only when they add up to at least this much over the whole run (train_steps at the
# measured rate): the bundled penguins run's 3 saves are 29% of its 0.2 s of training, which is
# not worth giving up a checkpoint for.
CHECKPOINT_MIN_SECONDS = 1.0
# A per-step input wait this short, from input served out of the in-memory cache, is tf.data
# getting one batch to the loop, not the pipeline working: measured on 2 CPU cores with
# in-memory batches, get_next waited 0.03 ms between idle calls and 0.07-0.08 ms after
# 0.7-1.3 ms steps from a full prefetch buffer, and 0.07 ms per 0.21 ms tabular step when the
# loop's own get_next takes them (as it takes cached batches, see inputs.make_dataset).
HANDOFF_WAIT_SECONDS = 1e-4
# The benchmark's figures (see the module's docstring), shipped with the training library.
BENCH_FIGURES_FILE = Path(__file__).with_name("bench_figures.json")
# The run's host work between loops is called the limit when it is at least this share of the
# training time and more than the input wait.
HOST_LIMIT_SHARE = 0.10


def _device_kind(device: DeviceFacts) -> str:
    return "gpu" if device.has_gpu else "cpu"


@dataclass(frozen=True)
class BenchFigures:
    """The benchmark's measured figures the advisor may quote (``bench_figures.json``, written
    by ``fullthrottle/bench/advisor_figures.py`` from ``LATEST.json``): levers on vs off,
    cached vs in-memory input, pre-batched copies vs streaming, the reader's rate per core and
    bf16 vs float32 matmuls, each for the model, precision and kind of device it was measured
    on. Each lookup returns None where the benchmark has no figure."""

    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def device_kind(self) -> str | None:
        return (self.data.get("device") or {}).get("kind")

    @property
    def machine(self) -> str:
        device = self.data.get("device") or {}
        return f"the benchmark's {device.get('cpu') or 'machine'}"

    def _match(
        self, key: str, model: str | None, precision: str, device: DeviceFacts, **extra: Any
    ) -> list[Mapping[str, Any]]:
        if model is None or self.device_kind != _device_kind(device):
            return []
        return [
            f
            for f in self.data.get(key) or []
            if f.get("model") == model
            and f.get("precision") == precision
            and all(f.get(k) == v for k, v in extra.items())
        ]

    def lever(
        self, field_name: str, value: Any, model: str | None, precision: str, device: DeviceFacts
    ) -> Mapping[str, Any] | None:
        """The lever's on/off figure for this model, precision and kind of device."""
        found = self._match("levers", model, precision, device, field=field_name, value=value)
        return found[0] if found else None

    def cached_vs_in_memory(
        self, model: str | None, precision: str, device: DeviceFacts
    ) -> Mapping[str, Any] | None:
        found = self._match("cached_vs_in_memory", model, precision, device)
        return found[0] if found else None

    def copies(
        self, model: str | None, precision: str, device: DeviceFacts, global_batch_size: int
    ) -> Mapping[str, Any] | None:
        """The copies' figure at the measured batch size nearest (by ratio) to the run's."""
        found = self._match("copies", model, precision, device)
        if not found or global_batch_size <= 0:
            return None
        return min(found, key=lambda f: abs(math.log(f["global_batch_size"] / global_batch_size)))

    def reader_per_core(self, *, prebatched: bool = False) -> float | None:
        """The streaming reader's tabular examples per CPU-second, from the records or from
        pre-batched copies (CPU work: it holds for a GPU host's input cores too)."""
        rates = self.data.get("reader_per_core") or {}
        return rates.get("prebatched" if prebatched else "records")

    def bf16_matmuls(self, device: DeviceFacts) -> Mapping[str, Any] | None:
        """bf16 vs float32 matmul rates, measured on a CPU with native bf16."""
        figure = self.data.get("bf16_vs_float32_matmuls")
        device_facts_ = self.data.get("device") or {}
        if figure is None or device.has_gpu or self.device_kind != "cpu":
            return None
        return figure if device_facts_.get("cpu_bf16") else None


@functools.cache
def bench_figures() -> BenchFigures:
    """The figures shipped with the training library (none if the file is missing)."""
    if not BENCH_FIGURES_FILE.exists():
        return BenchFigures()
    return BenchFigures(json.loads(BENCH_FIGURES_FILE.read_text(encoding="utf-8")))


def measured_faster(figure: Mapping[str, Any] | None) -> bool:
    """A lever's on/off figure says it is faster: the ratio above 1, and its interval (when it
    has one) wholly above 1."""
    if not figure or figure.get("ratio") is None or figure["ratio"] <= 1:
        return False
    interval = figure.get("interval")
    return interval is None or interval["low"] > 1


def quote(figure: Mapping[str, Any], figures: BenchFigures) -> str:
    """``measured 1.24x (94% interval 1.18-1.43) ... on the benchmark's <cpu>``."""
    interval = figure.get("interval")
    spread = (
        f" ({interval['coverage']:.0%} interval {interval['low']:.2f}-{interval['high']:.2f})"
        if interval
        else ""
    )
    return (
        f"measured {figure['ratio']:.2f}x{spread} for the {figure['model']} model in "
        f"{figure['precision']} on {figures.machine}"
    )


@dataclass(frozen=True)
class StepTimeMeasurements:
    """Mean per-step times over the measured (steady) loops of one run."""

    step_seconds: float  # loop wall time / steps
    input_wait_seconds: float  # time blocked on get_next / steps
    steps: int
    loops: int  # loops measured; the first loop (tracing) is excluded when there are more
    global_batch_size: int
    precision_policy: str
    # Whether the training input was served from the in-memory cache (None = unknown): the
    # advisor does not suggest `cache` for a run that already had it.
    input_cached: bool | None = None
    model_kind: str | None = None  # a registered model's name (None = unknown)
    # The host's work between loops (metric reads, summaries, hooks, periodic checkpoints) per
    # step, and the periodic checkpoints' share of it; 0 for records without them (the
    # benchmark's bare loop). The save at the end of training is not counted.
    host_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    checkpoints: int = 0  # periodic saves in the measured loops
    # The reader's own ceiling on this machine, examples/s (None = not measured: the advisor
    # then estimates it from the benchmark's reader rate per core and the machine's cores).
    reader_examples_per_second: float | None = None
    # Rows of the training split (None = unknown): with train_steps, how many times the run
    # reads its data, which pre-batched copies must exceed to pay for their write pass.
    training_rows: int | None = None

    @property
    def training_seconds(self) -> float:
        """Per step: the loop's time plus the host's work after it."""
        return self.step_seconds + self.host_seconds

    @property
    def checkpoint_fraction(self) -> float:
        t = self.training_seconds
        return self.checkpoint_seconds / t if t > 0 else 0.0

    @property
    def host_fraction(self) -> float:
        """Share of the training time outside the compiled loops, checkpoints included."""
        t = self.training_seconds
        return self.host_seconds / t if t > 0 else 0.0

    @property
    def input_wait_fraction(self) -> float:
        return (
            min(self.input_wait_seconds / self.step_seconds, 1.0) if self.step_seconds > 0 else 0.0
        )

    @property
    def compute_seconds(self) -> float:
        return max(self.step_seconds - self.input_wait_seconds, 0.0)


def measurements_from_history(
    history: Sequence[Mapping[str, Any]],
    *,
    global_batch_size: int,
    precision_policy: str,
    input_cached: bool | None = None,
    model_kind: str | None = None,
    reader_examples_per_second: float | None = None,
    training_rows: int | None = None,
) -> StepTimeMeasurements:
    """From the controller's loop records (``wall_time``, ``steps``, ``input_wait_time``).

    The first loop includes tracing (and XLA compilation), so it is dropped when there is more
    than one — the same steady-state window ``TrainResult.examples_per_second`` uses.
    """
    steady = list(history[1:] if len(history) > 1 else history)
    steps = sum(int(r[metrics.STEPS]) for r in steady)
    wall = sum(float(r[metrics.WALL_TIME]) for r in steady)
    wait = sum(float(r[metrics.INPUT_WAIT_TIME]) for r in steady)
    host = sum(float(r.get(metrics.HOST_TIME, 0.0)) for r in steady)
    saving = [float(r.get(metrics.CHECKPOINT_TIME, 0.0)) for r in steady]
    per = max(steps, 1)
    return StepTimeMeasurements(
        step_seconds=wall / per,
        input_wait_seconds=wait / per,
        steps=steps,
        loops=len(steady),
        global_batch_size=global_batch_size,
        precision_policy=precision_policy,
        input_cached=input_cached,
        model_kind=model_kind,
        host_seconds=max(host, 0.0) / per,
        checkpoint_seconds=sum(saving) / per,
        checkpoints=sum(1 for t in saving if t > 0),
        reader_examples_per_second=reader_examples_per_second,
        training_rows=training_rows,
    )


def classify(input_wait_fraction: float) -> str:
    if input_wait_fraction >= HIGH_INPUT_WAIT:
        return HIGHLY_INPUT_BOUND
    if input_wait_fraction >= MODERATE_INPUT_WAIT:
        return MODERATELY_INPUT_BOUND
    return NOT_INPUT_BOUND


def _item(field_name: str, value: Any, why: str) -> dict[str, Any]:
    return {"field": f"training.{field_name}", "value": value, "why": why}


def copies_break_even(copy: Mapping[str, Any]) -> float | None:
    """Epochs after which pre-batched copies have paid for their write pass, from the
    benchmark's figure: the write pass's time over what each epoch of the same rows saves
    (None when the copies were not measured faster)."""
    saving = copy["rows"] * (
        1 / copy["streaming_examples_per_second"] - 1 / copy["copies_examples_per_second"]
    )
    return copy["write_seconds"] / saving if saving > 0 else None


def _copies_advice(
    m: StepTimeMeasurements, config: TrainingConfig, device: DeviceFacts, figures: BenchFigures
) -> list[dict[str, Any]]:
    """Pre-batched copies, only for a run that reads its data more times than the measured
    break-even (its rows and the copies' figure for its model and precision known)."""
    if m.input_cached or config.input_snapshot_dir or not m.training_rows:
        return []
    copy = figures.copies(m.model_kind, m.precision_policy, device, m.global_batch_size)
    even = copies_break_even(copy) if copy else None
    epochs = config.train_steps * m.global_batch_size / m.training_rows
    if even is None or epochs <= even:
        return []
    return [
        _item(
            "input_snapshot_dir",
            "<a folder>",
            "the first run writes a pre-batched copy of each training file there (one record "
            "per 1,024 parsed rows) and every later epoch reads it instead of the records: on "
            f"{figures.machine} writing them took {copy['write_seconds']:.1f} s for "
            f"{copy['rows']:,} rows, and an epoch then ran at "
            f"{copy['copies_examples_per_second']:,.0f} vs "
            f"{copy['streaming_examples_per_second']:,.0f} examples/s (the {copy['model']} "
            f"model, {copy['precision']}, batch {copy['global_batch_size']}): paid back after "
            f"{even:.1f} epochs, and this run reads its data {epochs:.1f} times",
        )
    ]


def _input_advice(
    m: StepTimeMeasurements, config: TrainingConfig, device: DeviceFacts, figures: BenchFigures
) -> list[dict[str, Any]]:
    input_cached = m.input_cached
    advice = []
    if config.num_parallel_calls is not None and config.num_parallel_calls < device.cpu_count:
        advice.append(
            _item(
                "num_parallel_calls",
                None,
                f"parsing runs on {config.num_parallel_calls} thread(s) of {device.cpu_count} cores; "
                "None lets tf.data autotune the parallelism",
            )
        )
    if (
        config.interleave_cycle_length is not None
        and config.interleave_cycle_length < device.cpu_count
    ):
        advice.append(
            _item(
                "interleave_cycle_length",
                None,
                f"only {config.interleave_cycle_length} file(s) are read at a time; None reads as many "
                "in parallel as there are cores (needs several input files)",
            )
        )
    if config.cache is not True and not input_cached:
        advice.append(
            _item(
                "cache",
                True,
                "reads and parses each record once, then serves every epoch from memory as "
                "shuffled gathers ('auto' does this only when the files are small next to RAM; "
                "the transformed training split must fit in RAM)",
            )
        )
    advice += _copies_advice(m, config, device, figures)
    if config.prefetch_buffer_size is not None:
        advice.append(
            _item(
                "prefetch_buffer_size",
                None,
                f"a fixed prefetch of {config.prefetch_buffer_size} batch(es); "
                + (
                    "with None, cached batches are sliced by the loop's own get_next (no prefetch "
                    "thread handing them over, 1.05-1.06x on the tabular model)"
                    if input_cached
                    else "None autotunes it, which absorbs uneven parse times"
                ),
            )
        )
    if config.input_deterministic:
        advice.append(
            _item(
                "deterministic_input",
                False,
                "deterministic order makes parallel parsing wait for the slowest batch; False hands "
                "over whichever batch is ready (the set of examples per epoch is unchanged)",
            )
        )
    # Cached input is parsed once, so what a batch costs it is the per-batch hand-off.
    per_batch = (
        "handing each batch to the loop has a fixed cost"
        if input_cached
        else "parsing is one vectorized op per chunk of records, but each batch is still cut "
        "and handed over on its own"
    )
    advice.append(
        _item(
            "per_replica_batch_size",
            config.per_replica_batch_size * 2,
            f"{per_batch} and each step has a fixed cost, so larger batches cost less per "
            "example (the learning rate follows via learning_rate_scaling)",
        )
    )
    return advice


def _round_up(value: float, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple`` and to two significant digits."""
    n = max(int(-(-value // multiple)) * multiple, multiple)
    digits = 10 ** max(len(str(n)) - 2, 0)
    return int(-(-n // digits) * digits)


def _checkpoint_advice(m: StepTimeMeasurements, config: TrainingConfig) -> list[dict[str, Any]]:
    """Periodic checkpoints that take a visible share of the training time: a cadence that
    brings them to ~2%, with what it costs (the steps a killed run trains again)."""
    if not m.checkpoints or m.checkpoint_fraction < CHECKPOINT_SHARE or m.step_seconds <= 0:
        return []
    if m.checkpoint_seconds * config.train_steps < CHECKPOINT_MIN_SECONDS:
        return []
    per_save = m.checkpoint_seconds * m.steps / m.checkpoints
    other = m.training_seconds - m.checkpoint_seconds  # per step, without the saves
    # per_save / (steps x other + per_save) = target share
    steps = per_save * (1 - CHECKPOINT_TARGET_SHARE) / (CHECKPOINT_TARGET_SHARE * other)
    spent = (
        f"{m.checkpoints} periodic checkpoints took {m.checkpoint_fraction:.0%} of the training "
        f"time ({per_save * 1e3:.1f} ms each against {m.step_seconds * 1e3:.2f} ms steps)"
    )
    if config.checkpoint_every_steps > 0:
        every = _round_up(steps, config.steps_per_loop)
        if every >= config.train_steps:  # the whole run is shorter: save at its end only
            why = (
                f"{spent}; the whole run ({config.train_steps} steps, ~"
                f"{config.train_steps * other:.1f} s) is shorter than a cadence that would take "
                f"~{CHECKPOINT_TARGET_SHARE:.0%}, so 0 saves at the end only (a killed run then "
                "starts over)"
            )
            return [_item("checkpoint_every_steps", 0, why)]
        return [
            _item(
                "checkpoint_every_steps",
                every,
                f"{spent}; every {every} steps they would take ~{CHECKPOINT_TARGET_SHARE:.0%}, "
                f"and a killed run would train at most {every} steps (~"
                f"{every * other:.1f} s) again",
            )
        ]
    if config.checkpoint_every_seconds is not None:
        seconds = _round_up(steps * other, 1)
        return [
            _item(
                "checkpoint_every_seconds",
                float(seconds),
                f"{spent}; every {seconds} s they would take ~{CHECKPOINT_TARGET_SHARE:.0%}, "
                f"and a killed run would lose at most that much training",
            )
        ]
    return []


def _compute_advice(
    m: StepTimeMeasurements, config: TrainingConfig, device: DeviceFacts, figures: BenchFigures
) -> list[dict[str, Any]]:
    advice = []
    if m.precision_policy == "float32" and not device.has_gpu and device.cpu_bf16:
        # Measured on a CPU with native bf16 (the benchmark's matmul ceilings); a GPU's
        # float16 has no figure of the benchmark's, so it is not advised.
        matmuls = figures.bf16_matmuls(device)
        if matmuls and matmuls["ratio"] > 1:
            advice.append(
                _item(
                    "precision",
                    "mixed_bfloat16",
                    "this CPU has native bf16 (AVX512_BF16/AMX): oneDNN matmuls measured "
                    f"{matmuls['ratio']:.2f}x the float32 rate on {figures.machine} "
                    f"({matmuls['bfloat16_gflops']:.0f} vs {matmuls['float32_gflops']:.0f} "
                    "GFLOP/s); compare examples/s before keeping it",
                )
            )
    # The model's own levers (the registry's advice for the model that ran), where the
    # benchmark measured them faster for this model and precision.
    if m.model_kind in MODELS:
        spec = MODELS[m.model_kind]
        for lever in spec.advice(config.model_options(spec.name), config):
            name = f"models.{spec.name}.{lever.option}"
            figure = figures.lever(name, lever.value, spec.name, m.precision_policy, device)
            if measured_faster(figure):
                advice.append(_item(name, lever.value, f"{lever.why}; {quote(figure, figures)}"))
    # jit_compile switches the Transformer's padding trimming off (trims_padding): never
    # advised then, whatever XLA measured. Otherwise only where measured faster.
    trimming = m.model_kind == "transformer" and getattr(
        config.model_options("transformer"), "trim_padding", False
    )
    if not config.jit_compile and not trimming:
        figure = figures.lever("jit_compile", True, m.model_kind, m.precision_policy, device)
        if measured_faster(figure):
            advice.append(
                _item(
                    "jit_compile",
                    True,
                    f"XLA fuses the step's elementwise ops into its matmuls; {quote(figure, figures)}",
                )
            )
    if m.step_seconds < SMALL_STEP_SECONDS:
        if config.steps_per_loop < SMALL_LOOP_STEPS:
            cut = ""
            if 0 < config.checkpoint_every_steps < config.steps_per_loop * 4:
                cut = (
                    f"; loops are also cut at checkpoints, so raise checkpoint_every_steps "
                    f"({config.checkpoint_every_steps}) with it"
                )
            measured = ""
            if m.host_seconds > m.checkpoint_seconds:
                share = (m.host_seconds - m.checkpoint_seconds) / m.training_seconds
                measured = f" ({share:.1%} of the training time here, checkpoints aside)"
            advice.append(
                _item(
                    "steps_per_loop",
                    config.steps_per_loop * 4,
                    f"steps take {m.step_seconds * 1e3:.2f} ms: the host sync and bookkeeping at the "
                    f"end of every loop are a visible share{measured}; longer loops amortise "
                    f"them{cut}",
                )
            )
        advice.append(
            _item(
                "per_replica_batch_size",
                config.per_replica_batch_size * 2,
                f"steps take {m.step_seconds * 1e3:.2f} ms: too little work per step to keep the "
                "cores busy; a larger batch raises examples/s (learning rate follows "
                "learning_rate_scaling)",
            )
        )
    return advice


def cached_no_slower(figure: Mapping[str, Any] | None) -> bool:
    """The benchmark's cached vs in-memory figure says in-memory batches are no faster: the
    ratio's interval (when it has one) reaches 1, else the ratio does."""
    if not figure or figure.get("ratio") is None:
        return False
    interval = figure.get("interval")
    return (interval["high"] if interval else figure["ratio"]) >= 1


def advise(
    measurements: StepTimeMeasurements,
    config: TrainingConfig,
    device: DeviceFacts,
    figures: BenchFigures | None = None,
) -> dict[str, Any]:
    """The advisor's verdict for one run, JSON-ready.

    Returns ``classification`` (one of the three bands), the step-time split in milliseconds,
    ``advice`` (a list of ``{"field", "value", "why"}``; ``value`` None means "unset it:
    automatic") — input-pipeline knobs first when the run waits on input, compute knobs first
    otherwise — and ``notes`` (caveats about the measurement itself). ``figures``: the
    benchmark's (:func:`bench_figures`, shipped with the library, unless given).
    """
    m = measurements
    figures = bench_figures() if figures is None else figures
    fraction = m.input_wait_fraction
    band = classify(fraction)
    notes = []
    # Cached input whose in-memory twin the benchmark measured no faster: the wait is the
    # batches' hand-off, not the input's, and no input setting shrinks it.
    twin = figures.cached_vs_in_memory(m.model_kind, m.precision_policy, device)
    if band != NOT_INPUT_BOUND and m.input_cached and cached_no_slower(twin):
        notes.append(
            f"the input was cached in memory and waited {m.input_wait_seconds * 1e3:.3f} ms per "
            f"step ({fraction:.1%}); cached input {quote(twin, figures)} against batches "
            "already in memory, so the wait is the batches' hand-off to the loop, not the "
            "input pipeline: counted as not input-bound; fewer, larger batches shrink it"
        )
        band = NOT_INPUT_BOUND
    # Checkpoints are time outside the loop's input/compute split: first whatever the band.
    advice = _checkpoint_advice(m, config)
    if band == NOT_INPUT_BOUND:
        advice += _compute_advice(m, config, device, figures)
    elif band == MODERATELY_INPUT_BOUND:
        advice += _input_advice(m, config, device, figures)
        advice += _compute_advice(m, config, device, figures)
    else:
        advice += _input_advice(m, config, device, figures)
    # One item per field: the first (most relevant) reason wins.
    seen: set[str] = set()
    unique = []
    for item in advice:
        if item["field"] not in seen:
            seen.add(item["field"])
            unique.append(item)
    if band != NOT_INPUT_BOUND and m.input_cached and m.input_wait_seconds < HANDOFF_WAIT_SECONDS:
        notes.append(
            f"the input was cached in memory and the wait is {m.input_wait_seconds * 1e3:.3f} ms "
            "per step: that is about tf.data's fixed cost of getting one batch to the loop "
            "(measured 0.03-0.08 ms on CPU, batches already in memory alike), not pipeline work, "
            "so input-pipeline settings will not shrink it; fewer, larger batches will"
        )
    limit = _limit(m, band)
    ceiling, measured = _reader_ceiling(m, device, figures)
    if limit == "reader" and ceiling:
        cores_needed = m.global_batch_size / m.training_seconds / (ceiling / device.cpu_count)
        copies = (
            "write the Transform output as pre-batched records once (training.input_snapshot_dir: "
            "one record per 1,024 rows, read by every later epoch and run), "
            if "training.input_snapshot_dir" in seen
            else ""
        )
        notes.append(
            f"the reader limits this run: its ceiling is ~{ceiling:,.0f} examples/s on "
            f"{device.cpu_count} core(s) ({'measured' if measured else 'estimated from the benchmark'}"
            f"), the model would take ~{m.global_batch_size / max(m.compute_seconds, 1e-9):,.0f}. "
            f"Feeding it takes ~{cores_needed:.1f} input cores at this pace: {copies}give the "
            "input more threads (num_parallel_calls / interleave_cycle_length None, several "
            "input files), or move parsing to other machines' cores with the tf.data service"
        )
    records_rate = figures.reader_per_core()
    if device.has_gpu and m.compute_seconds > 0 and records_rate:
        gpus = len(device.gpu_compute_capabilities)
        per_gpu = m.global_batch_size / m.compute_seconds / gpus
        needed = per_gpu / records_rate
        prebatched_rate = figures.reader_per_core(prebatched=True)
        copies = (
            f", ~{per_gpu / prebatched_rate:.1f} reading pre-batched copies "
            f"(training.input_snapshot_dir, ~{prebatched_rate:,.0f})"
            if prebatched_rate
            else ""
        )
        notes.append(
            f"at its compute pace (~{per_gpu:,.0f} examples/s per GPU) each GPU needs "
            f"~{needed:.1f} input cores for the streaming reader (~{records_rate:,.0f} tabular "
            f"examples per core-second on {figures.machine}){copies}; this machine has "
            f"{device.cpu_count / gpus:.1f} per GPU"
            + (
                ": too few for the records, so cache, pre-batched copies or the tf.data "
                "service's remote workers decide its speed"
                if needed > device.cpu_count / gpus
                else ""
            )
        )
    if m.loops < 2:
        notes.append(
            "measured over one loop, which includes tracing: run more steps than "
            "steps_per_loop for a steady-state figure"
        )
    return {
        "classification": band,
        # What sets the pace: "reader" (waiting on streamed input), "batch hand-off" (waiting
        # on cached input), "host overhead" (work between the loops) or "compute" (the step).
        "limit": limit,
        # None: neither measured for this run nor in the benchmark's figures.
        "reader_ceiling_examples_per_second": None if ceiling is None else round(ceiling),
        "reader_ceiling_measured": measured,
        "input_wait_fraction": round(fraction, 4),
        "step_time_ms": round(m.step_seconds * 1e3, 4),
        "input_wait_ms": round(m.input_wait_seconds * 1e3, 4),
        "compute_ms": round(m.compute_seconds * 1e3, 4),
        # Per step, between the loops (host work incl. periodic checkpoints), and shares of the
        # training time (loop + between).
        "between_loops_ms": round(m.host_seconds * 1e3, 4),
        "checkpoint_ms": round(m.checkpoint_seconds * 1e3, 4),
        "between_loops_fraction": round(m.host_fraction, 4),
        "checkpoint_fraction": round(m.checkpoint_fraction, 4),
        "steps_measured": m.steps,
        "precision_policy": m.precision_policy,
        "device": device.describe(),
        "advice": unique,
        "notes": notes,
    }


def _limit(m: StepTimeMeasurements, band: str) -> str:
    """Which of the reader (or, for cached input, the batches' hand-off), the host's work
    between loops, or the step's compute sets the pace."""
    if m.host_fraction >= HOST_LIMIT_SHARE and m.host_fraction > m.input_wait_fraction:
        return "host overhead"
    if band == NOT_INPUT_BOUND:
        return "compute"
    return "batch hand-off" if m.input_cached else "reader"


def _reader_ceiling(
    m: StepTimeMeasurements, device: DeviceFacts, figures: BenchFigures
) -> tuple[float | None, bool]:
    """The reader's examples/s ceiling: measured when the run gives it, else the benchmark's
    per-core rate times the machine's cores (tf.data's parallel stages use them all), else
    None."""
    if m.reader_examples_per_second:
        return m.reader_examples_per_second, True
    rate = figures.reader_per_core()
    return (rate * device.cpu_count if rate else None), False


def advise_result(
    result: TrainResult,
    config: TrainingConfig,
    device: DeviceFacts | None = None,
    *,
    training_rows: int | None = None,
    figures: BenchFigures | None = None,
) -> dict[str, Any]:
    """:func:`advise` over a ``TrainResult`` (its loop history), on this machine by default."""
    measurements = measurements_from_history(
        result.history,
        global_batch_size=result.facts.global_batch_size,
        precision_policy=result.facts.precision_policy,
        input_cached=result.facts.input_cached,
        model_kind=result.facts.model_kind,
        training_rows=training_rows,
    )
    return advise(measurements, config, device or device_facts(), figures)


def format_advice(report: Mapping[str, Any], indent: str = "  ") -> list[str]:
    """Human-readable lines for a report from :func:`advise`."""
    lines = [
        f"{indent}step time {report['step_time_ms']:.2f} ms = input wait {report['input_wait_ms']:.2f} ms "
        f"+ compute {report['compute_ms']:.2f} ms: {report['classification']} "
        f"({report['input_wait_fraction']:.1%} waiting)"
    ]
    if report.get("between_loops_ms"):
        lines.append(
            f"{indent}between loops {report['between_loops_ms']:.2f} ms per step "
            f"({report['between_loops_fraction']:.1%} of the training time), of which checkpoints "
            f"{report['checkpoint_ms']:.2f} ms ({report['checkpoint_fraction']:.1%})"
        )
    for item in report["advice"]:
        value = "None (automatic)" if item["value"] is None else repr(item["value"])
        lines.append(f"{indent}  try {item['field']}={value}: {item['why']}")
    if not report["advice"]:
        lines.append(f"{indent}  no change suggested for this device")
    for note in report.get("notes", []):
        lines.append(f"{indent}  note: {note}")
    return lines
