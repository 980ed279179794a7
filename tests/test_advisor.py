"""The step-time advisor: real loops that wait on input or on compute, device rules, and the
benchmark's figures it advises from.

The input-bound run has an artificially slow map (a 30 ms sleep per batch) after the real
TFRecord pipeline; the compute-bound one trains a wide MLP on batches held in memory. Both run
the training library's compiled loop and measure input wait exactly as a training run does.
The figures are ``bench/results/LATEST.json``'s, through the generator that writes the file
shipped with the training library; the measured-slower cases are LATEST.json's own where it has
them, and the same document with one figure changed where it does not.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
import tomllib

import pytest
import tensorflow as tf

from fullthrottle.bench.advisor_figures import FIGURES_FILE, advisor_figures, figures_text
from fullthrottle.bench.docs import LATEST_JSON
from fullthrottle.bench.trainer import OurLoop
from tests.bench_data import write_synthetic_training_data
from trainer_module.training import TrainingConfig
from trainer_module.training.advisor import (
    BENCH_FIGURES_FILE,
    HIGHLY_INPUT_BOUND,
    NOT_INPUT_BOUND,
    BenchFigures,
    StepTimeMeasurements,
    advise,
    bench_figures,
    format_advice,
    measurements_from_history,
)
from trainer_module.training.hardware import DeviceFacts

CPU_NO_BF16 = DeviceFacts(cpu_flags=frozenset({"avx2", "fma"}), cpu_count=2)
CPU_BF16 = DeviceFacts(cpu_flags=frozenset({"avx512f", "avx512_bf16"}), cpu_count=2)
GPU_V100 = DeviceFacts(cpu_count=8, gpu_compute_capabilities=((7, 0),))
LATEST = json.loads(LATEST_JSON.read_text(encoding="utf-8"))
TRAINER = LATEST["results"]["trainer"]
FIGURES = BenchFigures(advisor_figures(LATEST))


def _figures_with(change) -> BenchFigures:
    """LATEST.json's figures with ``change`` (a function of the figures' dict) applied."""
    data = copy.deepcopy(advisor_figures(LATEST))
    change(data)
    return BenchFigures(data)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_synthetic_training_data(tmp_path_factory.mktemp("advisor"), rows=512, numeric=8)


def _fields(report):
    return [item["field"].removeprefix("training.") for item in report["advice"]]


def _run(loop: OurLoop, loops: int, steps: int):
    for _ in range(loops):
        loop.run_loop(steps)
    return measurements_from_history(
        loop.records, global_batch_size=loop.batch.global_batch, precision_policy=loop.policy
    )


def test_slow_input_map_is_highly_input_bound_and_advice_names_input_knobs(data):
    config = TrainingConfig(
        model="tabular",
        precision="float32",
        per_replica_batch_size=32,
        steps_per_loop=5,
        num_parallel_calls=1,
        prefetch_buffer_size=1,
        deterministic_input=True,
    )

    def slow(features, label):
        # The producer sleeps 30 ms per batch; a step of this MLP takes well under 1 ms.
        delay = tf.py_function(lambda: time.sleep(0.03) or 0.0, [], tf.float64)
        with tf.control_dependencies([delay]):
            return {k: tf.identity(v) for k, v in features.items()}, tf.identity(label)

    loop = OurLoop(data, config, dataset_transform=lambda ds: ds.map(slow))
    measured = _run(loop, loops=3, steps=5)
    report = advise(measured, config, CPU_BF16, FIGURES)
    assert report["classification"] == HIGHLY_INPUT_BOUND, report
    assert report["input_wait_fraction"] >= 0.2
    fields = _fields(report)
    for knob in (
        "num_parallel_calls",
        "cache",
        "prefetch_buffer_size",
        "deterministic_input",
        "per_replica_batch_size",
    ):
        assert knob in fields, fields
    # Input-bound: compute knobs are not what to change first, so they are not offered.
    assert "precision" not in fields and "jit_compile" not in fields
    assert any("highly input-bound" in line for line in format_advice(report))


def test_in_memory_wide_model_is_not_input_bound_and_advice_names_compute_knobs(data):
    config = TrainingConfig(
        model="tabular",
        precision="float32",
        per_replica_batch_size=1024,
        models={"tabular": {"hidden_units": (1024, 1024)}},
        steps_per_loop=4,
        dropout_rate=0.0,
    )
    # Steps of tens of ms: the loop's get_next of an in-memory batch is a small part of them.
    loop = OurLoop(data, config, source="memory", memory_batches=2)
    measured = _run(loop, loops=3, steps=4)
    report = advise(measured, config, CPU_BF16, FIGURES)
    assert report["classification"] == NOT_INPUT_BOUND, report
    fields = _fields(report)
    assert report["advice"][0]["field"] == "training.precision"
    assert report["advice"][0]["value"] == "mixed_bfloat16"
    # Quoting the benchmark's matmul ceilings, as LATEST.json has them.
    ceilings = TRAINER["transformer"]["matmul_ceiling"]
    bf16, f32 = (ceilings[d]["flops_per_second"] for d in ("bfloat16", "float32"))
    assert f"measured {bf16 / f32:.2f}x the float32 rate" in report["advice"][0]["why"]
    assert f"({bf16 / 1e9:.0f} vs {f32 / 1e9:.0f} GFLOP/s)" in report["advice"][0]["why"]
    # The benchmark has no XLA figure: jit_compile is not advised.
    assert "jit_compile" not in fields
    assert not {
        "cache",
        "num_parallel_calls",
        "prefetch_buffer_size",
        "interleave_cycle_length",
    } & set(fields)


def _compute_bound(step_ms: float = 20.0, policy: str = "float32") -> StepTimeMeasurements:
    return StepTimeMeasurements(
        step_seconds=step_ms / 1e3,
        input_wait_seconds=0.0,
        steps=100,
        loops=2,
        global_batch_size=64,
        precision_policy=policy,
    )


def test_no_precision_advice_the_device_cannot_use_or_the_benchmark_did_not_measure():
    config = TrainingConfig(precision="float32")
    # A CPU with native bf16: advised, as LATEST.json measured bf16 matmuls faster there.
    assert "precision" in _fields(advise(_compute_bound(), config, CPU_BF16, FIGURES))
    # A CPU without AVX512_BF16/AMX: no bf16 (emulated bf16 is slower than float32), never float16.
    report = advise(_compute_bound(), config, CPU_NO_BF16, FIGURES)
    values = [(i["field"], i["value"]) for i in report["advice"]]
    assert ("training.precision", "mixed_bfloat16") not in values
    assert all(v != "mixed_float16" for _, v in values)
    # A GPU: the benchmark's figures are a CPU's, so neither float16 nor XLA is advised there.
    report = advise(_compute_bound(), config, GPU_V100, FIGURES)
    assert not {"precision", "jit_compile"} & set(_fields(report))
    # bf16 matmuls measured no faster than float32: no precision advice.
    slower = _figures_with(lambda f: f["bf16_vs_float32_matmuls"].update(ratio=0.9))
    assert "precision" not in _fields(advise(_compute_bound(), config, CPU_BF16, slower))
    # No matmul figure at all: silent too.
    none = _figures_with(lambda f: f.pop("bf16_vs_float32_matmuls"))
    assert "precision" not in _fields(advise(_compute_bound(), config, CPU_BF16, none))
    # Already bf16 on a bf16 CPU: no precision change, and no XLA (no figure measured it faster).
    report = advise(_compute_bound(policy="mixed_bfloat16"), TrainingConfig(), CPU_BF16, FIGURES)
    assert "training.precision" not in _fields(report) and "jit_compile" not in _fields(report)


def test_cache_is_advised_only_when_the_input_streamed():
    def fields(cached, cache="auto", copies=None):
        m = StepTimeMeasurements(0.001, 0.0008, 100, 3, 64, "float32", input_cached=cached)
        config = TrainingConfig(cache=cache, input_snapshot_dir=copies)
        return _fields(advise(m, config, CPU_NO_BF16, FIGURES))

    assert "cache" in fields(False) and "cache" in fields(None)
    assert "cache" not in fields(True)  # `auto` already cached this run's input
    assert "cache" not in fields(None, cache=True)
    assert "per_replica_batch_size" in fields(True)  # what is left: fewer, larger batches


def _break_even(batch: int) -> float:
    """Epochs for pre-batched copies to pay back their write pass, from LATEST.json's rows:
    the write pass's seconds over the seconds each epoch of the same rows saves."""
    st = TRAINER["tabular"]["streaming"]
    per_epoch = (
        st["rows"] / st[f"b{batch}"]["streaming"]["median"]
        - st["rows"] / st[f"b{batch}_prebatched"]["prebatched"]["median"]
    )
    return st["reader_prebatched"]["write_seconds"] / per_epoch


def _copies_advice(
    epochs,
    batch=64,
    figures=FIGURES,
    model="tabular",
    policy="mixed_bfloat16",
    cached=False,
    **config,
):
    """The advice for an input-bound run reading its 10,000 rows ``epochs`` times."""
    rows = 10_000
    m = StepTimeMeasurements(
        0.001,
        0.0008,
        100,
        3,
        batch,
        policy,
        input_cached=cached,
        model_kind=model,
        training_rows=None if epochs is None else rows,
    )
    steps = round((epochs or 1) * rows / batch)
    report = advise(m, TrainingConfig(train_steps=steps, **config), CPU_BF16, figures)
    return {i["field"].removeprefix("training."): i for i in report["advice"]}, report


def test_pre_batched_copies_only_past_the_measured_break_even():
    for batch in (64, 256):
        even = _break_even(batch)
        assert 1 < even < 10  # LATEST.json's: about 1.6 and 1.9 epochs
        advice, report = _copies_advice(even * 1.1, batch)
        why = advice["input_snapshot_dir"]["why"]
        # The figures quoted are LATEST.json's, and the break-even is computed from them.
        st = TRAINER["tabular"]["streaming"]
        assert f"paid back after {even:.1f} epochs" in why
        assert f"writing them took {st['reader_prebatched']['write_seconds']:.1f} s" in why
        assert f"{st[f'b{batch}_prebatched']['prebatched']['median']:,.0f} vs " in why
        assert f"batch {batch}" in why and f"reads its data {even * 1.1:.1f} times" in why
        # The reader's note names the copies among its levers only when they are advised.
        assert "input_snapshot_dir" in " ".join(report["notes"])
        advice, report = _copies_advice(even * 0.9, batch)
        assert "input_snapshot_dir" not in advice
        assert "input_snapshot_dir" not in " ".join(report["notes"])
    # The run's batch picks the figure: between the two break-evens, yes at 64, no at 256.
    between = (_break_even(64) + _break_even(256)) / 2
    assert "input_snapshot_dir" in _copies_advice(between, 64)[0]
    assert "input_snapshot_dir" not in _copies_advice(between, 256)[0]
    # Silent without the run's rows, for another model or precision (no figure measured them),
    # when the copies already exist, and when the input was cached.
    assert "input_snapshot_dir" not in _copies_advice(None)[0]
    assert "input_snapshot_dir" not in _copies_advice(10, model="transformer")[0]
    assert "input_snapshot_dir" not in _copies_advice(10, policy="float32")[0]
    assert "input_snapshot_dir" not in _copies_advice(10, input_snapshot_dir="/data/copies")[0]
    assert "input_snapshot_dir" not in _copies_advice(10, cached=True)[0]
    # Silent when LATEST.json lacks the write pass, and when the copies measured slower.
    missing = _figures_with(lambda f: f.update(copies=[]))
    assert "input_snapshot_dir" not in _copies_advice(10, figures=missing)[0]

    def slower(f):
        for c in f["copies"]:
            c["copies_examples_per_second"] = c["streaming_examples_per_second"] * 0.95

    assert "input_snapshot_dir" not in _copies_advice(100, figures=_figures_with(slower))[0]


def _lever_fields(kind, off=False, figures=FIGURES, policy="mixed_bfloat16", option=None, **config):
    models = {"transformer": {option: False}} if off else {}
    m = StepTimeMeasurements(0.2, 0.001, 100, 3, 64, policy, model_kind=kind)
    report = advise(m, TrainingConfig(models=models, **config), CPU_BF16, figures)
    return {i["field"].removeprefix("training."): i["why"] for i in report["advice"]}


def _lever_quote(key: str) -> str:
    """How the advice quotes a lever row of LATEST.json: the lower of its ratio of medians and
    paired median (as its target would be judged), with the paired median's interval."""
    row = TRAINER["transformer"][key]
    low, high, coverage = (row["paired_interval"][k] for k in ("low", "high", "coverage"))
    ratio = min(row["ratio"], row["paired_median"])
    return f"measured {ratio:.2f}x ({coverage:.0%} interval {low:.2f}-{high:.2f})"


def _set_levers(**update):
    return _figures_with(lambda f: [x.update(update) for x in f["levers"]])


FASTER = {"ratio": 1.5, "interval": {"low": 1.2, "high": 1.8, "coverage": 0.9375}}


def test_transformer_levers_follow_the_benchmark():
    fused, trim = "models.transformer.fused_kernels", "models.transformer.trim_padding"
    # Fused kernels: measured faster in LATEST.json, advised with its figure.
    assert TRAINER["transformer"]["fused_vs_unfused"]["paired_interval"]["low"] > 1
    why = _lever_fields("transformer", off=True, option="fused_kernels")[fused]
    assert _lever_quote("fused_vs_unfused") in why and "mixed_bfloat16" in why
    # Trimming padding: LATEST.json's ratio is below 1 (its interval straddles 1): not advised.
    assert TRAINER["transformer"]["trimmed_vs_untrimmed"]["ratio"] < 1
    assert trim not in _lever_fields("transformer", off=True, option="trim_padding")
    # The same lever once measured faster is advised, quoting that figure.
    why = _lever_fields(
        "transformer", off=True, option="trim_padding", figures=_set_levers(**FASTER)
    )
    assert "measured 1.50x (94% interval 1.20-1.80)" in why[trim]
    # Faster by its ratio, but with an interval reaching below 1: not measured faster.
    straddles = _set_levers(ratio=1.3, interval={"low": 0.95, "high": 1.4, "coverage": 0.9375})
    assert fused not in _lever_fields(
        "transformer", off=True, option="fused_kernels", figures=straddles
    )
    # A figure without an interval is judged on its ratio alone.
    for ratio, advised in ((0.95, False), (1.1, True)):
        bare = _set_levers(ratio=ratio, interval=None)
        fields = _lever_fields("transformer", off=True, option="fused_kernels", figures=bare)
        assert (fused in fields) is advised, ratio
    # Measured in mixed_bfloat16: a float32 run has no figure, so the lever is not advised.
    assert fused not in _lever_fields(
        "transformer", off=True, option="fused_kernels", policy="float32"
    )
    # No figures at all (a file without the trainer benchmark): silent.
    assert fused not in _lever_fields(
        "transformer", off=True, option="fused_kernels", figures=BenchFigures()
    )


@pytest.mark.parametrize("option", ["fused_kernels", "trim_padding"])
def test_transformer_levers_are_advised_only_for_a_transformer_run_without_them(option):
    field = f"models.transformer.{option}"
    # Both measured faster, so that only the model, its options and XLA decide here.
    faster = _set_levers(**FASTER)

    def fields(kind, off=False, **config):
        return _lever_fields(kind, off=off, figures=faster, option=option, **config)

    assert field in fields("transformer", off=True)
    assert field not in fields("transformer")  # the default: already on
    assert field not in fields("tabular", off=True)  # no text: nothing to fuse or trim
    assert field not in fields(None, off=True)  # model unknown
    # Whole-graph XLA fuses everything itself, and needs shapes before the data (no trimming).
    assert field not in fields("transformer", off=True, jit_compile=True)


def test_bands_and_small_steps():
    def at(wait_fraction: float) -> str:
        m = StepTimeMeasurements(0.01, 0.01 * wait_fraction, 100, 3, 64, "float32")
        return advise(m, TrainingConfig(), CPU_NO_BF16)["classification"]

    assert [at(0.0), at(0.049), at(0.05), at(0.199), at(0.2), at(0.9)] == [
        "not input-bound",
        "not input-bound",
        "moderately input-bound",
        "moderately input-bound",
        "highly input-bound",
        "highly input-bound",
    ]
    # 1 ms steps with 50-step loops: longer loops and bigger batches are advised.
    report = advise(_compute_bound(step_ms=1.0), TrainingConfig(steps_per_loop=50), CPU_NO_BF16)
    advice = {i["field"]: i["value"] for i in report["advice"]}
    assert advice["training.steps_per_loop"] == 200
    assert advice["training.per_replica_batch_size"] == 128


def test_a_short_wait_from_cached_input_is_explained_as_the_hand_off():
    def notes(wait_ms: float, cached: bool | None, step_ms: float = 0.24) -> list[str]:
        m = StepTimeMeasurements(
            step_ms / 1e3, wait_ms / 1e3, 5000, 10, 64, "float32", input_cached=cached
        )
        return advise(m, TrainingConfig(), CPU_NO_BF16)["notes"]

    # The bench's tabular run: 0.08 ms of a 0.24 ms step, cached -> highly input-bound + note.
    (note,) = notes(0.08, True)
    assert (
        "0.080 ms" in note and "getting one batch to the loop" in note and "larger batches" in note
    )
    # A streaming pipeline may be slow: no hand-off note (the reader's own note instead).
    assert not any("getting one batch" in n for n in notes(0.08, False) + notes(0.08, None))
    # ... and the batch-size advice names the cost cached input still pays per batch.
    m = StepTimeMeasurements(0.24e-3, 0.08e-3, 5000, 10, 64, "float32", input_cached=True)
    why = {i["field"]: i["why"] for i in advise(m, TrainingConfig(), CPU_NO_BF16)["advice"]}
    assert why["training.per_replica_batch_size"].startswith("handing each batch")
    m = StepTimeMeasurements(0.24e-3, 0.08e-3, 5000, 10, 64, "float32", input_cached=False)
    why = {i["field"]: i["why"] for i in advise(m, TrainingConfig(), CPU_NO_BF16)["advice"]}
    assert why["training.per_replica_batch_size"].startswith("parsing is one vectorized op")
    assert notes(0.5, True, step_ms=1.0) == []  # longer than a hand-off: the pipeline is slow
    assert notes(0.005, True, step_ms=1.0) == []  # not input-bound: nothing to explain


def test_pipeline_run_saves_and_prints_the_advisor(penguins_run):
    from tests.helpers import last_run

    output_dir, completed = penguins_run
    training = last_run(output_dir)["training"]
    advisor = training["advisor"]
    assert advisor["step_time_ms"] > 0 and advisor["steps_measured"] > 0
    # The saved report is the advisor's over the run's own loop records, on its machine: the
    # same band, limit and split again from the summary's history.
    device = DeviceFacts(
        cpu_flags=frozenset({"avx512_bf16"} if advisor["device"]["cpu_bf16"] else ()),
        cpu_count=advisor["device"]["cpu_count"],
        gpu_compute_capabilities=tuple(
            tuple(c) for c in advisor["device"]["gpu_compute_capabilities"]
        ),
    )
    measured = measurements_from_history(
        training["history"],
        global_batch_size=training["global_batch_size"],
        precision_policy=training["precision_policy"],
        input_cached=training["input_cached"],
        model_kind=training["model_kind"],
    )
    again = advise(measured, TrainingConfig(), device)
    for key in ("classification", "limit", "input_wait_fraction", "step_time_ms"):
        assert advisor[key] == again[key], key
    # The bundled run's input is cached: whatever waits, it is not the reader.
    assert training["input_cached"] and advisor["limit"] != "reader"
    assert "step-time advisor:" in completed.stdout
    assert advisor["classification"] in completed.stdout


def _checkpointing(step_ms=0.3, save_ms=12.5, every=100, other_host_ms=0.025):
    """Measurements of 20 loops of 50 steps with a save every `every` steps."""
    steps = 1000
    saves = steps // every
    return StepTimeMeasurements(
        step_seconds=step_ms / 1e3,
        input_wait_seconds=0.0,
        steps=steps,
        loops=20,
        global_batch_size=64,
        precision_policy="mixed_bfloat16",
        host_seconds=(other_host_ms + save_ms * saves / steps) / 1e3,
        checkpoint_seconds=save_ms * saves / steps / 1e3,
        checkpoints=saves,
    )


def test_checkpoint_cadence_is_advised_when_saves_take_a_visible_share():
    config = TrainingConfig(train_steps=20_000, steps_per_loop=50, checkpoint_every_steps=100)
    m = _checkpointing()
    assert m.checkpoint_fraction == pytest.approx(0.125 / 0.45)
    report = advise(m, config, CPU_BF16)
    first = report["advice"][0]  # whatever the band: time outside the loop's split
    assert first["field"] == "training.checkpoint_every_steps"
    # The suggestion brings the saves to <= 2% of the training time, and not far below it.
    every = first["value"]
    assert every % config.steps_per_loop == 0
    share = lambda n: 12.5 / (n * (0.3 + 0.025) + 12.5)  # noqa: E731
    assert share(every) <= 0.02 < share(every - 2 * config.steps_per_loop)
    assert "10 periodic checkpoints took 28%" in first["why"]
    assert report["checkpoint_fraction"] == pytest.approx(0.2778, abs=1e-4)
    assert "of which checkpoints 0.12 ms (27.8%)" in "\n".join(format_advice(report))
    # A run shorter than that cadence: save at the end only.
    slow = _checkpointing(save_ms=500.0)
    short = advise(slow, dataclasses.replace(config, train_steps=1000), CPU_BF16)["advice"][0]
    assert (short["field"], short["value"]) == ("training.checkpoint_every_steps", 0)
    assert "the whole run (1000 steps, ~0.3 s)" in short["why"]
    # Saves that add up to under a second over the whole run are not worth advising against.
    brief = dataclasses.replace(config, train_steps=1000)  # 10 saves x 12.5 ms
    assert "checkpoint_every_steps" not in _fields(advise(m, brief, CPU_BF16))
    # Cheap saves (under 5% of the time): no checkpoint advice.
    assert "checkpoint_every_steps" not in _fields(
        advise(_checkpointing(save_ms=1.0), config, CPU_BF16)
    )
    # Time-triggered checkpoints get a time cadence; none at all (end only): nothing to advise.
    timed = dataclasses.replace(config, checkpoint_every_steps=0, checkpoint_every_seconds=0.02)
    fields = {i["field"]: i["value"] for i in advise(m, timed, CPU_BF16)["advice"]}
    assert fields["training.checkpoint_every_seconds"] >= 1.0
    ends_only = dataclasses.replace(m, checkpoint_seconds=0.0, checkpoints=0)
    assert not {"checkpoint_every_steps", "checkpoint_every_seconds"} & set(
        _fields(advise(ends_only, TrainingConfig(checkpoint_every_steps=0), CPU_BF16))
    )


def test_a_run_that_checkpoints_every_loop_is_told_what_its_saves_cost(tmp_path):
    """A real `train()`: a tabular step is well under a millisecond and a save ~10 ms, so saving
    every 5 steps spends most of the training time in checkpoints; saving only at the end
    spends none of the measured time (the final save is kept apart)."""
    from tests.training_data import feature_spec, tabular_inputs, write_records
    from trainer_module.training import train
    from trainer_module.training.advisor import advise_result

    inputs = tabular_inputs()
    files = write_records(tmp_path / "data", inputs, files=1, per_file=256)

    def run(every, name):
        config = TrainingConfig(
            per_replica_batch_size=32,
            train_steps=60,
            steps_per_loop=5,
            checkpoint_every_steps=every,
            models={"tabular": {"hidden_units": (16,)}},
        )
        result = train(
            config=config,
            model_inputs=inputs,
            feature_spec=feature_spec(inputs),
            train_files=files,
            eval_files=(),
            work_dir=str(tmp_path / name),
        )
        return result, advise_result(result, config, CPU_BF16)

    result, report = run(5, "often")
    periodic = [r["checkpoint_time"] for r in result.history[:-1]]
    assert len(periodic) == 11 and all(t > 0 for t in periodic)
    assert result.history[-1]["checkpoint_time"] == 0 < result.history[-1]["final_checkpoint_time"]
    assert all(r["host_time"] >= r["checkpoint_time"] for r in result.history)
    assert report["checkpoint_fraction"] > 0.2
    # 60 steps: the saves add up to well under a second, so no advice for this run...
    assert "checkpoint_every_steps" not in _fields(report)
    # ...but the same measurements for a 200,000-step run: a cadence of many loops.
    m = measurements_from_history(
        result.history, global_batch_size=32, precision_policy=result.facts.precision_policy
    )
    assert m.checkpoints == 10  # the first loop (tracing) is not measured
    long_run = TrainingConfig(train_steps=200_000, steps_per_loop=5, checkpoint_every_steps=5)
    first = advise(m, long_run, CPU_BF16)["advice"][0]
    assert first["field"] == "training.checkpoint_every_steps" and first["value"] >= 50
    assert "between loops" in "\n".join(format_advice(report))

    result, report = run(0, "at_end")
    assert all(r["checkpoint_time"] == 0 for r in result.history)
    assert result.history[-1]["final_checkpoint_time"] > 0
    assert report["checkpoint_fraction"] == 0
    assert "checkpoint_every_steps" not in _fields(report)


def _jit_figures(model: str, policy: str, ratio: float) -> BenchFigures:
    """LATEST.json's figures plus an XLA on vs off figure (LATEST.json has none)."""
    lever = {"model": model, "precision": policy, "field": "jit_compile", "value": True}
    interval = {"low": ratio * 0.9, "high": ratio * 1.1, "coverage": 0.9375}
    return _figures_with(
        lambda f: f["levers"].append({**lever, "ratio": ratio, "interval": interval})
    )


@pytest.mark.parametrize("device", [CPU_NO_BF16, CPU_BF16])
def test_xla_only_where_measured_faster_and_never_with_padding_trimming(device):
    """jit_compile turns the Transformer's trim_padding off: a trimming Transformer is never
    told to try it, even where XLA was measured faster; elsewhere it follows the figure."""

    def fields(kind, policy="float32", figures=FIGURES, **options):
        models = {"transformer": options} if options else {}
        m = StepTimeMeasurements(0.2, 0.001, 100, 3, 64, policy, model_kind=kind)
        config = TrainingConfig(precision=policy, models=models)
        return _fields(advise(m, config, device, figures))

    # LATEST.json has no XLA figure: never advised.
    for kind in ("transformer", "tabular", None):
        assert "jit_compile" not in fields(kind, trim_padding=False)
    # Measured faster for the float32 Transformer: advised without trimming only, quoted.
    faster = _jit_figures("transformer", "float32", 1.2)
    assert "jit_compile" not in fields("transformer", figures=faster)  # trims by default
    assert "jit_compile" in fields("transformer", figures=faster, trim_padding=False)
    m = StepTimeMeasurements(0.2, 0.001, 100, 3, 64, "float32", model_kind="transformer")
    config = TrainingConfig(precision="float32", models={"transformer": {"trim_padding": False}})
    why = {i["field"]: i["why"] for i in advise(m, config, device, faster)["advice"]}
    assert "measured 1.20x (94% interval 1.08-1.32)" in why["training.jit_compile"]
    # ... but not for another model or precision, nor on a GPU (the figure is a CPU's).
    assert "jit_compile" not in fields("tabular", figures=faster)
    assert "jit_compile" not in fields("transformer", "mixed_bfloat16", faster, trim_padding=False)
    gpu = advise(m, config, GPU_V100, faster)
    assert "jit_compile" not in _fields(gpu)
    # XLA with bf16 on CPU, measured slower (the Transformer's XLA `fit`: about 0.3x): silent.
    slower = _jit_figures("transformer", "mixed_bfloat16", 0.32)
    assert "jit_compile" not in fields("transformer", "mixed_bfloat16", slower, trim_padding=False)


def _waiting(cached, model="tabular", policy="mixed_bfloat16", reader=None):
    """LATEST.json's tabular advisor reading: 0.115 ms of input wait in a 0.40 ms step."""
    return StepTimeMeasurements(
        0.3992e-3,
        0.1147e-3,
        1000,
        10,
        64,
        policy,
        input_cached=cached,
        model_kind=model,
        reader_examples_per_second=reader,
    )


def test_cached_input_whose_in_memory_twin_is_no_faster_is_not_called_input_bound():
    # In-memory batches measured no faster than the cached input (the interval reaches 1).
    no_faster = _figures_with(
        lambda f: f["cached_vs_in_memory"][0].update(
            ratio=0.99, interval={"low": 0.97, "high": 1.02, "coverage": 0.9}
        )
    )
    report = advise(_waiting(True, reader=445_870.0), TrainingConfig(), CPU_BF16, no_faster)
    assert (report["classification"], report["limit"]) == (NOT_INPUT_BOUND, "compute")
    note = " ".join(report["notes"])
    assert "measured 0.99x" in note and "0.97-1.02" in note
    assert "hand-off" in note
    assert not any("highly input-bound" in line for line in format_advice(report))
    # No input knob is offered for it: it is not the input.
    assert not {"cache", "num_parallel_calls", "input_snapshot_dir"} & set(_fields(report))
    # The same wait from streamed input: highly input-bound, and the reader is the limit.
    streamed = advise(_waiting(False, reader=445_870.0), TrainingConfig(), CPU_BF16, no_faster)
    assert (streamed["classification"], streamed["limit"]) == (HIGHLY_INPUT_BOUND, "reader")
    # In-memory batches measured faster than the cached input: the band stands, yet the limit
    # of cached input is the batches' hand-off, never the reader.
    faster_twin = _figures_with(
        lambda f: f["cached_vs_in_memory"][0].update(
            ratio=0.8, interval={"low": 0.75, "high": 0.85, "coverage": 0.9}
        )
    )
    report = advise(_waiting(True), TrainingConfig(), CPU_BF16, faster_twin)
    assert (report["classification"], report["limit"]) == (HIGHLY_INPUT_BOUND, "batch hand-off")
    # No figure for this model and precision: the band stands, the limit is not the reader.
    report = advise(_waiting(True, policy="float32"), TrainingConfig(), CPU_BF16, FIGURES)
    assert (report["classification"], report["limit"]) == (HIGHLY_INPUT_BOUND, "batch hand-off")


def test_the_report_names_what_limits_the_run_and_the_readers_ceiling():
    def report(step, wait, host=0.0, cached=False, reader=None, figures=FIGURES):
        m = StepTimeMeasurements(
            step,
            wait,
            100,
            3,
            256,
            "float32",
            input_cached=cached,
            host_seconds=host,
            reader_examples_per_second=reader,
        )
        return advise(m, TrainingConfig(), CPU_NO_BF16, figures)

    reader_bound = report(0.002, 0.0015, reader=150_000.0)
    assert reader_bound["limit"] == "reader"
    assert reader_bound["reader_ceiling_examples_per_second"] == 150_000
    assert reader_bound["reader_ceiling_measured"] is True
    note = " ".join(reader_bound["notes"])
    for lever in ("more threads", "tf.data service", "input cores"):
        assert lever in note, lever
    # Pre-batched copies are not among them: nothing says this run pays for their write pass.
    assert "input_snapshot_dir" not in note
    # Without its own reading, the ceiling is LATEST.json's reader per core x the cores.
    per_core = TRAINER["tabular"]["streaming"]["reader"]["per_cpu_second"]["median"]
    estimated = report(0.002, 0.0015)
    assert estimated["reader_ceiling_examples_per_second"] == round(2 * per_core)
    assert estimated["reader_ceiling_measured"] is False
    # ... and without that figure, no ceiling and no note built on one.
    unknown = report(0.002, 0.0015, figures=_figures_with(lambda f: f.pop("reader_per_core")))
    assert unknown["reader_ceiling_examples_per_second"] is None
    assert not any("ceiling" in n for n in unknown["notes"])
    assert report(0.01, 0.0001)["limit"] == "compute"
    assert report(0.001, 0.00001, host=0.0005)["limit"] == "host overhead"


def test_gpu_runs_are_told_the_input_cores_each_gpu_needs():
    streaming = TRAINER["tabular"]["streaming"]
    records = streaming["reader"]["per_cpu_second"]["median"]
    copies = streaming["reader_prebatched"]["per_cpu_second"]["median"]
    # A tabular step at 4M examples/s per GPU on a machine with 8 cores for its one GPU.
    m = StepTimeMeasurements(256 / 4e6, 0.0, 100, 3, 256, "mixed_float16", model_kind="tabular")
    notes = " ".join(advise(m, TrainingConfig(), GPU_V100, FIGURES)["notes"])
    assert f"~{4e6 / records:.1f} input cores" in notes and "8.0 per GPU" in notes
    assert f"~{records:,.0f} tabular examples per core-second" in notes
    assert f"~{4e6 / copies:.1f} reading pre-batched" in notes
    assert "too few" in notes
    slow = dataclasses.replace(m, step_seconds=256 / 1e6)
    assert "too few" not in " ".join(advise(slow, TrainingConfig(), GPU_V100, FIGURES)["notes"])
    # Without the reader's figure, no such note.
    none = _figures_with(lambda f: f.pop("reader_per_core"))
    assert not any("input cores" in n for n in advise(m, TrainingConfig(), GPU_V100, none)["notes"])


def test_the_shipped_figures_are_latest_jsons():
    """The file the installed advisor reads is exactly what LATEST.json renders to (rewritten by
    `fullthrottle bench`; `fullthrottle bench --docs` after a change of the generator), is
    package data, and is what the advisor loads by default."""
    assert BENCH_FIGURES_FILE.resolve() == FIGURES_FILE.resolve()
    assert BENCH_FIGURES_FILE.read_text(encoding="utf-8") == figures_text(LATEST), (
        "trainer_module/training/bench_figures.json is stale: run `fullthrottle bench --docs`"
    )
    assert bench_figures() == FIGURES
    pyproject = tomllib.loads((FIGURES_FILE.parents[2] / "pyproject.toml").read_text("utf-8"))
    package_data = pyproject["tool"]["setuptools"]["package-data"]["trainer_module.training"]
    assert BENCH_FIGURES_FILE.name in package_data
