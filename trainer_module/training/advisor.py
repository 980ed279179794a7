"""The step-time advisor: is this training run waiting on its input, and what to change.

Owns: splitting a run's step time into input wait and compute (from the loop records the
controller already keeps), classifying it in TensorFlow profiler's bands — not input-bound
(< 5% of step time waiting), moderately (5-20%), highly (>= 20%) — and turning that into advice
that names our config fields. :func:`advise` is a pure function of the measurements, the config
and the device facts; :func:`device_facts` is the only part that looks at the machine.

Refuses to advise what the device cannot use: no ``mixed_bfloat16`` on a CPU without
AVX512_BF16/AMX-BF16, no ``mixed_float16`` without a GPU of compute capability >= 7.0 (never on
a CPU), no XLA with bf16 on a CPU (measured slower than bf16 alone on the project's CI CPUs:
276 vs 374 examples/s, docs/performance.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainer_module.training.config import TrainingConfig

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


@dataclass(frozen=True)
class DeviceFacts:
    """What the training device can do (only what the advice depends on)."""

    cpu_flags: frozenset[str] = frozenset()
    cpu_count: int = 1
    gpu_compute_capabilities: tuple[tuple[int, int], ...] = ()

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu_compute_capabilities)

    @property
    def cpu_bf16(self) -> bool:
        return bool({"avx512_bf16", "amx_bf16"} & self.cpu_flags)

    @property
    def gpu_float16(self) -> bool:  # tensor cores
        return self.has_gpu and min(self.gpu_compute_capabilities) >= (7, 0)

    def describe(self) -> dict[str, Any]:
        return {
            "cpu_count": self.cpu_count,
            "cpu_bf16": self.cpu_bf16,
            "gpu_compute_capabilities": [list(c) for c in self.gpu_compute_capabilities],
        }


def device_facts() -> DeviceFacts:
    """This machine's facts: CPU flags from /proc/cpuinfo, GPUs from TensorFlow."""
    from trainer_module.training.precision import _gpu_compute_capabilities, cpu_flags

    return DeviceFacts(
        cpu_flags=cpu_flags(),
        cpu_count=len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else (os.cpu_count() or 1),
        gpu_compute_capabilities=tuple(_gpu_compute_capabilities()),
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
    model_kind: str | None = None  # "tabular" | "transformer" (None = unknown)

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
) -> StepTimeMeasurements:
    """From the controller's loop records (``wall_time``, ``steps``, ``input_wait_time``).

    The first loop includes tracing (and XLA compilation), so it is dropped when there is more
    than one — the same steady-state window ``TrainResult.examples_per_second`` uses.
    """
    steady = list(history[1:] if len(history) > 1 else history)
    steps = sum(int(r["steps"]) for r in steady)
    wall = sum(float(r["wall_time"]) for r in steady)
    wait = sum(float(r["input_wait_time"]) for r in steady)
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
    )


def classify(input_wait_fraction: float) -> str:
    if input_wait_fraction >= HIGH_INPUT_WAIT:
        return HIGHLY_INPUT_BOUND
    if input_wait_fraction >= MODERATE_INPUT_WAIT:
        return MODERATELY_INPUT_BOUND
    return NOT_INPUT_BOUND


def _item(field_name: str, value: Any, why: str) -> dict[str, Any]:
    return {"field": f"training.{field_name}", "value": value, "why": why}


def _input_advice(
    config: TrainingConfig, device: DeviceFacts, input_cached: bool | None = None
) -> list[dict[str, Any]]:
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
    if config.prefetch_buffer_size is not None:
        advice.append(
            _item(
                "prefetch_buffer_size",
                None,
                f"a fixed prefetch of {config.prefetch_buffer_size} batch(es); None autotunes it, "
                "which absorbs uneven parse times",
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
    advice.append(
        _item(
            "per_replica_batch_size",
            config.per_replica_batch_size * 2,
            "parsing is one vectorized op per batch and each step has a fixed cost, so larger "
            "batches cost less per example (the learning rate follows via learning_rate_scaling)",
        )
    )
    return advice


def _compute_advice(
    m: StepTimeMeasurements, config: TrainingConfig, device: DeviceFacts
) -> list[dict[str, Any]]:
    advice = []
    if m.precision_policy == "float32":
        if device.has_gpu and device.gpu_float16:
            advice.append(
                _item(
                    "precision",
                    "mixed_float16",
                    "the GPU has tensor cores: matmuls run several times faster in 16-bit "
                    "(variables stay float32; float16 gets loss scaling)",
                )
            )
        elif not device.has_gpu and device.cpu_bf16:
            advice.append(
                _item(
                    "precision",
                    "mixed_bfloat16",
                    "this CPU has native bf16 (AVX512_BF16/AMX): oneDNN matmuls about 2x the "
                    "float32 rate (measured 410 vs 213 GFLOP/s on the CI machine)",
                )
            )
    if m.model_kind == "transformer" and not config.fused_kernels and not config.jit_compile:
        advice.append(
            _item(
                "fused_kernels",
                True,
                "runs the Transformer's layer norms, GELU, softmax dropout and residual dropouts "
                "as fused XLA kernels between the matmuls (same maths and weights; measured "
                "1.31x on the d_model 256 bench Transformer in mixed_bfloat16 on a 2-core CPU)",
            )
        )
    if m.model_kind == "transformer" and not config.trim_padding and not config.jit_compile:
        advice.append(
            _item(
                "trim_padding",
                True,
                "cuts each batch's text after its longest text, so padding costs no matmuls "
                "(same outputs and gradients; measured 2.3x on the bundled text data, whose "
                "batches hold 57 of 128 tokens; no gain where texts fill the sequence)",
            )
        )
    if not config.jit_compile:
        if device.has_gpu:
            advice.append(
                _item("jit_compile", True, "XLA fuses the step's elementwise ops into its matmuls")
            )
        elif m.precision_policy == "float32":
            advice.append(
                _item(
                    "jit_compile",
                    True,
                    "XLA fuses elementwise ops on CPU too (measured about +8% for a float32 "
                    "Transformer); compare examples/s before keeping it",
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
            advice.append(
                _item(
                    "steps_per_loop",
                    config.steps_per_loop * 4,
                    f"steps take {m.step_seconds * 1e3:.2f} ms: the host sync and bookkeeping at the "
                    f"end of every loop are a visible share; longer loops amortise them{cut}",
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


def advise(
    measurements: StepTimeMeasurements, config: TrainingConfig, device: DeviceFacts
) -> dict[str, Any]:
    """The advisor's verdict for one run, JSON-ready.

    Returns ``classification`` (one of the three bands), the step-time split in milliseconds,
    ``advice`` (a list of ``{"field", "value", "why"}``; ``value`` None means "unset it:
    automatic") — input-pipeline knobs first when the run waits on input, compute knobs first
    otherwise — and ``notes`` (caveats about the measurement itself).
    """
    m = measurements
    fraction = m.input_wait_fraction
    band = classify(fraction)
    if band == NOT_INPUT_BOUND:
        advice = _compute_advice(m, config, device)
    elif band == MODERATELY_INPUT_BOUND:
        advice = _input_advice(config, device, m.input_cached) + _compute_advice(m, config, device)
    else:
        advice = _input_advice(config, device, m.input_cached)
    # One item per field: the first (most relevant) reason wins.
    seen: set[str] = set()
    unique = []
    for item in advice:
        if item["field"] not in seen:
            seen.add(item["field"])
            unique.append(item)
    notes = []
    if m.loops < 2:
        notes.append(
            "measured over one loop, which includes tracing: run more steps than "
            "steps_per_loop for a steady-state figure"
        )
    return {
        "classification": band,
        "input_wait_fraction": round(fraction, 4),
        "step_time_ms": round(m.step_seconds * 1e3, 4),
        "input_wait_ms": round(m.input_wait_seconds * 1e3, 4),
        "compute_ms": round(m.compute_seconds * 1e3, 4),
        "steps_measured": m.steps,
        "precision_policy": m.precision_policy,
        "device": device.describe(),
        "advice": unique,
        "notes": notes,
    }


def advise_result(
    result: Any, config: TrainingConfig, device: DeviceFacts | None = None
) -> dict[str, Any]:
    """:func:`advise` over a ``TrainResult`` (its loop history), on this machine by default."""
    measurements = measurements_from_history(
        result.history,
        global_batch_size=result.global_batch_size,
        precision_policy=result.precision_policy,
        input_cached=getattr(result, "input_cached", None),
        model_kind=getattr(result, "model_kind", None),
    )
    return advise(measurements, config, device or device_facts())


def format_advice(report: Mapping[str, Any], indent: str = "  ") -> list[str]:
    """Human-readable lines for a report from :func:`advise`."""
    lines = [
        f"{indent}step time {report['step_time_ms']:.2f} ms = input wait {report['input_wait_ms']:.2f} ms "
        f"+ compute {report['compute_ms']:.2f} ms: {report['classification']} "
        f"({report['input_wait_fraction']:.1%} waiting)"
    ]
    for item in report["advice"]:
        value = "None (automatic)" if item["value"] is None else repr(item["value"])
        lines.append(f"{indent}  try {item['field']}={value}: {item['why']}")
    if not report["advice"]:
        lines.append(f"{indent}  no change suggested for this device")
    for note in report.get("notes", []):
        lines.append(f"{indent}  note: {note}")
    return lines
