"""The step-time advisor: real loops that wait on input or on compute, and device rules.

The input-bound run has an artificially slow map (a 30 ms sleep per batch) after the real
TFRecord pipeline; the compute-bound one trains a wide MLP on batches held in memory. Both run
the training library's compiled loop and measure input wait exactly as a training run does.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import tensorflow as tf

from fullthrottle.bench.trainer import OurLoop
from tests.bench_data import write_synthetic_training_data
from trainer_module.training import TrainingConfig
from trainer_module.training.advisor import (
    HIGHLY_INPUT_BOUND,
    NOT_INPUT_BOUND,
    READER_EXAMPLES_PER_CORE_SECOND,
    StepTimeMeasurements,
    advise,
    format_advice,
    gpu_input_cores,
    measurements_from_history,
)
from trainer_module.training.hardware import DeviceFacts

CPU_NO_BF16 = DeviceFacts(cpu_flags=frozenset({"avx2", "fma"}), cpu_count=2)
CPU_BF16 = DeviceFacts(cpu_flags=frozenset({"avx512f", "avx512_bf16"}), cpu_count=2)
GPU_V100 = DeviceFacts(cpu_count=8, gpu_compute_capabilities=((7, 0),))


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
    report = advise(measured, config, CPU_BF16)
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
    report = advise(measured, config, CPU_BF16)
    assert report["classification"] == NOT_INPUT_BOUND, report
    fields = _fields(report)
    assert report["advice"][0]["field"] == "training.precision"
    assert report["advice"][0]["value"] == "mixed_bfloat16"
    assert "jit_compile" in fields
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


def test_no_precision_advice_the_device_cannot_use():
    config = TrainingConfig(precision="float32")
    # A CPU without AVX512_BF16/AMX: no bf16 (emulated bf16 is slower than float32), never float16.
    report = advise(_compute_bound(), config, CPU_NO_BF16)
    values = [(i["field"], i["value"]) for i in report["advice"]]
    assert ("training.precision", "mixed_bfloat16") not in values
    assert all(v != "mixed_float16" for _, v in values)
    # A GPU with tensor cores: float16 with loss scaling.
    report = advise(_compute_bound(), config, GPU_V100)
    assert ("training.precision", "mixed_float16") in [
        (i["field"], i["value"]) for i in report["advice"]
    ]
    # Already bf16 on a bf16 CPU: no precision change, and no XLA (measured slower with bf16 there).
    report = advise(_compute_bound(policy="mixed_bfloat16"), TrainingConfig(), CPU_BF16)
    assert "training.precision" not in _fields(report) and "jit_compile" not in _fields(report)


def test_cache_and_pre_batched_copies_are_advised_only_when_the_input_streamed():
    def fields(cached, cache="auto", copies=None):
        m = StepTimeMeasurements(0.001, 0.0008, 100, 3, 64, "float32", input_cached=cached)
        config = TrainingConfig(cache=cache, input_snapshot_dir=copies)
        return _fields(advise(m, config, CPU_NO_BF16))

    assert "cache" in fields(False) and "cache" in fields(None)
    assert "cache" not in fields(True)  # `auto` already cached this run's input
    assert "cache" not in fields(None, cache=True)
    assert "input_snapshot_dir" in fields(False)
    assert "input_snapshot_dir" not in fields(True)
    assert "input_snapshot_dir" not in fields(False, copies="/data/copies")
    assert "per_replica_batch_size" in fields(True)  # what is left: fewer, larger batches


@pytest.mark.parametrize("option", ["fused_kernels", "trim_padding"])
def test_transformer_levers_are_advised_only_for_a_transformer_run_without_them(option):
    field = f"models.transformer.{option}"

    def fields(kind, off=False, **config):
        models = {"transformer": {option: False}} if off else {}
        m = StepTimeMeasurements(0.2, 0.001, 100, 3, 64, "mixed_bfloat16", model_kind=kind)
        return _fields(advise(m, TrainingConfig(models=models, **config), CPU_BF16))

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
    advisor = last_run(output_dir)["training"]["advisor"]
    assert advisor["classification"] in (
        "not input-bound",
        "moderately input-bound",
        "highly input-bound",
    )
    assert advisor["step_time_ms"] > 0 and advisor["steps_measured"] > 0
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


@pytest.mark.parametrize("device", [CPU_NO_BF16, GPU_V100])
def test_xla_is_never_advised_where_it_switches_padding_trimming_off(device):
    """jit_compile turns the Transformer's trim_padding off; XLA without trimming measured
    0.36-0.48x of the trimmed step, so a trimming Transformer is never told to try it."""

    def fields(kind, **options):
        models = {"transformer": options} if options else {}
        m = StepTimeMeasurements(0.2, 0.001, 100, 3, 64, "float32", model_kind=kind)
        return _fields(advise(m, TrainingConfig(precision="float32", models=models), device))

    assert "jit_compile" not in fields("transformer")  # trims by default
    assert "jit_compile" in fields("transformer", trim_padding=False)
    assert "jit_compile" in fields("tabular")


def test_the_report_names_what_limits_the_run_and_the_readers_ceiling():
    def report(step, wait, host=0.0, cached=False, reader=None, device=CPU_NO_BF16):
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
        return advise(m, TrainingConfig(), device)

    reader_bound = report(0.002, 0.0015, reader=150_000.0)
    assert reader_bound["limit"] == "reader"
    assert reader_bound["reader_ceiling_examples_per_second"] == 150_000
    assert reader_bound["reader_ceiling_measured"] is True
    note = " ".join(reader_bound["notes"])
    for lever in ("pre-batched records", "input_snapshot_dir", "more threads", "tf.data service"):
        assert lever in note, lever
    assert "input cores" in note
    estimated = report(0.002, 0.0015)
    assert estimated["reader_ceiling_examples_per_second"] == 2 * READER_EXAMPLES_PER_CORE_SECOND
    assert estimated["reader_ceiling_measured"] is False
    assert report(0.01, 0.0001)["limit"] == "compute"
    assert report(0.001, 0.00001, host=0.0005)["limit"] == "host overhead"


def test_gpu_runs_are_told_the_input_cores_each_gpu_needs():
    assert gpu_input_cores(2 * READER_EXAMPLES_PER_CORE_SECOND) == pytest.approx(2.0)
    # A tabular step at 4M examples/s per GPU on a machine with 8 cores for its one GPU.
    m = StepTimeMeasurements(256 / 4e6, 0.0, 100, 3, 256, "mixed_float16", model_kind="tabular")
    notes = " ".join(advise(m, TrainingConfig(), GPU_V100)["notes"])
    assert f"~{gpu_input_cores(4e6):.1f} input cores" in notes and "8.0 per GPU" in notes
    prebatched = gpu_input_cores(4e6, prebatched=True)
    assert (
        0 < prebatched < gpu_input_cores(4e6) and f"~{prebatched:.1f} reading pre-batched" in notes
    )
    assert "too few" in notes
    slow = dataclasses.replace(m, step_seconds=256 / 1e6)
    assert "too few" not in " ".join(advise(slow, TrainingConfig(), GPU_V100)["notes"])
