"""The benchmark code runs on tiny sizes and produces a complete, honest results document.

No timing assertions: benchmarks are not tests. What is checked is that each benchmark measures
what it says (both contenders ran, on the same data; the ratio is the ratio of the medians; the
FLOP count is the documented formula) and that results are written without overwriting.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from fullthrottle.bench import docs, model_process, suite, verdicts
from fullthrottle.bench.benchmarks import BENCHMARKS, Context, beam, checkpoints
from fullthrottle.bench.benchmarks import trainer as trainer_bench
from fullthrottle.bench.benchmarks.base import REPO, ratio_entry
from fullthrottle.bench.measure import alternate, describe, median_interval, ratio
from fullthrottle.bench.results import (
    latest_markdown,
    markdown_table,
    results_table,
    write_results,
)
from fullthrottle.bench.trainer import (
    CPU_METRICS,
    OurLoop,
    StrongFit,
    metered,
    reader_rates,
    tracking_rates,
    training_flops_per_example,
)
from tests.bench_data import write_synthetic_training_data
from trainer_module.training import TrainingConfig
from trainer_module.training.advisor import classify

TINY = suite.sizes_for(
    "quick",
    trainer={
        "repeats": 2,
        "tabular_repeats": 2,
        "transformer_window_steps": 3,
        "transformer_window_seconds": None,
        "fused_vs_unfused": True,
        "tabular_window_steps": 10,
        "tabular_baseline_window_steps": None,
        "reader_batches": 5,
        "streaming_rows": 3000,
        "streaming_files": 2,
        "streaming_repeats": 2,
        "streaming_window_examples": 640,
    },
    tracking={"train_steps": 20, "repeats": 1},
    beam={"rows": (120,), "workers": (1,)},
)
TRAINER = TINY["trainer"]
TINY_TRANSFORMER = TrainingConfig(
    model="transformer",
    precision="float32",
    per_replica_batch_size=8,
    steps_per_loop=3,
    models={
        "transformer": {
            "layers": 1,
            "d_model": 16,
            "heads": 2,
            "ffn_dim": 32,
            "hidden_units": [16],
        },
        "tabular": {"hidden_units": [16]},
    },
)


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    return write_synthetic_training_data(
        tmp_path_factory.mktemp("bench_text"), rows=64, numeric=2, seq_len=12
    )


def test_alternate_rotates_order_and_ratio_is_of_medians():
    calls = []
    rates = {"a": iter([10.0, 30.0, 20.0]), "b": iter([5.0, 10.0, 40.0])}
    samples = alternate(
        {n: (lambda n=n: calls.append(n) or next(rates[n])) for n in "ab"}, repeats=3
    )
    assert calls == ["a", "b", "b", "a", "a", "b"]
    r = ratio(samples, "a", "b")
    assert r["ratio"] == pytest.approx(20.0 / 10.0)
    assert r["paired"] == pytest.approx([2.0, 3.0, 0.5])
    assert r["paired_median"] == pytest.approx(2.0)
    # A target is judged on the lower of the two ratios: load that shifted between repetitions
    # can lift the ratio of medians above what every paired window saw.
    shifted = {"ours": [144.0, 263.0, 249.0], "base": [120.0, 105.0, 184.0]}
    entry = ratio(shifted, "ours", "base")
    assert entry["ratio"] > 2.0 and entry["paired_median"] < 1.4
    document_targets = verdicts.judge({"trainer": {"transformer": {"vs_tfx_example": entry}}})
    verdict = {t["name"]: t for t in document_targets}["transformer_vs_tfx_example"]
    assert verdict["measured"] == pytest.approx(entry["paired_median"]) and not verdict["met"]
    assert describe(samples["a"])["spread"] == pytest.approx((30 - 10) / 20)
    # MFU too is judged on the lower of its two estimates.
    mfu = {"ours": 0.52, "ours_paired_median": 0.49}
    verdict = {t["name"]: t for t in verdicts.judge({"trainer": {"transformer": {"mfu": mfu}}})}[
        "transformer_mfu"
    ]
    assert verdict["measured"] == pytest.approx(0.49) and verdict["met"] is False


def test_side_by_side_pair_runs_back_to_back_and_takes_turns_going_first():
    calls = []
    contenders = {n: (lambda n=n: calls.append(n) or 1.0) for n in ("ours", "mem", "fit", "ceil")}
    samples = alternate(contenders, repeats=6, side_by_side=("ours", "mem"))
    orders = [calls[i : i + 4] for i in range(0, len(calls), 4)]
    assert orders == [
        ["ours", "mem", "fit", "ceil"],
        ["fit", "ceil", "ours", "mem"],
        ["ceil", "ours", "mem", "fit"],
        ["mem", "ours", "fit", "ceil"],
        ["fit", "ceil", "mem", "ours"],
        ["ceil", "mem", "ours", "fit"],
    ]
    assert all(len(v) == 6 for v in samples.values())

    def predecessors(name):  # what ran right before each of `name`'s windows
        return sorted(calls[i - 1] for i in range(1, len(calls)) if calls[i] == name)

    # Whatever ran before a window can slow it: over 2 x 3 units each of the pair follows the
    # other as often as the other follows it, and when first follows the same neighbours (the
    # very first window has none; at its place in the rotation the pair later follows `fit`).
    assert predecessors("ours").count("mem") == predecessors("mem").count("ours") == 3
    assert [p for p in predecessors("ours") if p != "mem"] + ["fit"] == ["ceil", "ceil", "fit"]
    assert [p for p in predecessors("mem") if p != "ours"] == ["ceil", "ceil", "fit"]
    with pytest.raises(ValueError, match="side_by_side"):
        alternate(contenders, repeats=1, side_by_side=("ours", "nope"))


def test_median_interval_is_the_binomial_order_statistics():
    # 13 values: x(4)-x(10) covers the median with probability 1 - 2 P(Binomial(13, 1/2) <= 3).
    interval = median_interval([float(v) for v in range(13, 0, -1)])
    assert (interval["low"], interval["high"]) == (4.0, 10.0)
    assert interval["coverage"] == pytest.approx(1 - 2 * (1 + 13 + 78 + 286) / 2**13)
    # Too few values for 90%: the whole range, with the coverage it has.
    three = median_interval([3.0, 1.0, 2.0])
    assert (three["low"], three["high"], three["coverage"]) == (1.0, 3.0, pytest.approx(0.75))


def _tracking_verdict(paired: list[float]) -> tuple[dict, str]:
    """The tracking target's verdict, and its table row, for these paired on/off ratios."""
    entry = ratio_entry({"on": paired, "off": [1.0] * len(paired)}, "on", "off")
    results = {"tracking": {**entry, "train_steps": 100}}
    document = {
        "results": results,
        "targets": verdicts.judge(results),
        "machine": {"cpu": "x", "cpu_count": 2, "cpu_bf16": False, "gpus": [], "tensorflow": "t"},
        "mode": "quick",
        "date": "d",
        "git_commit": "c",
        "suite_seconds": 1.0,
    }
    verdict = {t["name"]: t for t in document["targets"]}["tracking_on_vs_off"]
    row = next(r for r in markdown_table(document).splitlines() if "MLflow on vs off" in r)
    return verdict, row


def test_a_verdict_is_decided_only_when_the_interval_clears_the_line():
    # Met, and the interval x(4)-x(10) (0.993-0.999) lies above 0.98: decided.
    met, row = _tracking_verdict([0.99 + 0.001 * i for i in range(13)])
    assert met["met"] and met["decided"] and row.endswith(">= 0.98: met |")
    # Missed, and the interval (0.933-0.939) lies below the line: decided.
    missed, row = _tracking_verdict([0.93 + 0.001 * i for i in range(13)])
    assert not missed["met"] and missed["decided"] and row.endswith(">= 0.98: NOT met |")
    # Missed on the median (0.976), but its interval 0.972-0.985 reaches past 0.98: undecided.
    straddle = [0.95, 0.96, 0.965, 0.972, 0.974, 0.975, 0.976, 0.978, 0.98, 0.985, 0.99, 1.0, 1.01]
    undecided, row = _tracking_verdict(straddle)
    assert not undecided["met"] and not undecided["decided"]
    assert undecided["paired_interval"]["low"] == 0.972
    assert undecided["paired_interval"]["high"] == 0.985
    assert "NOT met (undecided: the paired median's 91% interval 0.972-0.985 contains" in row
    # Three pairs, all above the line, still decide nothing at 90%.
    few, row = _tracking_verdict([1.0, 1.01, 1.02])
    assert few["met"] and not few["decided"] and "too few pairs for a 90% interval" in row


def _mfu_verdict(paired: list[float]) -> tuple[dict, str]:
    """The Transformer MFU target's verdict and text for these per-window MFUs."""
    mfu = {
        "ours": statistics.median(paired),
        "ours_paired_median": statistics.median(paired),
        "ours_paired": paired,
    }
    (target,) = [
        t
        for t in verdicts.judge({"trainer": {"transformer": {"mfu": mfu}}})
        if t["name"] == "transformer_mfu"
    ]
    return target, verdicts.verdict_text(target)


def test_mfu_is_decided_by_the_interval_of_its_windows():
    # 13 windows: the interval x(4)-x(10). Wholly above 0.70: met; wholly below: NOT met.
    above, text = _mfu_verdict([0.72 + 0.001 * i for i in range(13)])
    assert above["met"] and above["decided"] and text == ">= 0.7: met"
    below, text = _mfu_verdict([0.60 + 0.001 * i for i in range(13)])
    assert not below["met"] and below["decided"] and text == ">= 0.7: NOT met"
    # Straddling the line (median 0.698, interval 0.692-0.704): undecided, and says so.
    straddle, text = _mfu_verdict([0.686 + 0.002 * i for i in range(13)])
    assert straddle["paired_interval"]["low"] < 0.7 <= straddle["paired_interval"]["high"]
    assert not straddle["met"] and not straddle["decided"]
    assert "NOT met (undecided: the paired median's 91% interval 0.692-0.704 contains" in text
    # Readings from before the windows' MFUs were recorded: recomputed from the contender's
    # and the ceiling's samples, window by window, as the committed LATEST.json records them.
    latest = json.loads((REPO / "bench" / "results" / "LATEST.json").read_text(encoding="utf-8"))
    for model in ("transformer", "tabular"):
        m = copy.deepcopy(latest["results"]["trainer"][model])
        recorded = m["mfu"].pop("ours_paired")
        paired = trainer_bench.mfu_paired(m)
        assert paired is not None and paired == pytest.approx(recorded)
        assert statistics.median(paired) == pytest.approx(m["mfu"]["ours_paired_median"])
        assert (min(paired), max(paired)) == pytest.approx(
            (m["mfu"]["ours_paired_min"], m["mfu"]["ours_paired_max"])
        )
    # Without either: judged on the value alone, no interval, no "decided".
    bare = verdicts.judge({"trainer": {"transformer": {"mfu": {"ours": 0.5}}}})
    (target,) = [t for t in bare if t["name"] == "transformer_mfu"]
    assert target["met"] is False and "paired_interval" not in target


def test_the_advisor_row_names_the_readers_ceiling_only_when_there_is_one():
    latest = json.loads((REPO / "bench" / "results" / "LATEST.json").read_text(encoding="utf-8"))
    entry = latest["results"]["trainer"]["transformer"]

    def advisor_row(**advisor):
        model = {**entry, "advisor": {**entry["advisor"], **advisor}}
        rows = trainer_bench.rows({"transformer": model}, lambda name: "")
        return next(r for r in rows if r.startswith("| transformer: advisor |"))

    assert "limit: compute (reader ceiling 12,345 examples/s, measured) |" in advisor_row(
        reader_ceiling_examples_per_second=12_345
    )
    row = advisor_row(
        limit="batch hand-off",
        reader_ceiling_examples_per_second=None,
        reader_ceiling_measured=False,
    )
    assert "limit: batch hand-off |" in row and "ceiling" not in row


def test_transformer_flops_follow_the_documented_formula(text_data):
    s, d, f, classes = 12, 16, 32, 3
    width = 2 + d  # numeric features + pooled text
    forward = (8 * s * d * d + 4 * s * s * d + 4 * s * d * f) + 2 * width * 16 + 2 * 16 * classes
    flops = training_flops_per_example(text_data, TINY_TRANSFORMER)
    assert flops["forward"] == forward
    assert flops["training"] == 3 * forward


def test_trainer_benchmark_on_tiny_transformer(text_data, tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    # In its own process, as the suite measures each model. Windows sized in seconds, as in
    # quick mode: a window this short is the 2-step minimum, whatever the step time.
    work = tmp_path / "work"
    sizes = dataclasses.replace(TRAINER, transformer_window_seconds=1e-6)
    result = trainer_bench.measure_model_in_process(
        work, text_data, TINY_TRANSFORMER, sizes, TRAINER.transformer_window_steps, "transformer"
    )
    # The process skips teardown, so autograph's generated files stay: in the job's own temp
    # folder (removed with the suite's work folder), not in the user's.
    assert list(temp.iterdir()) == []
    assert list((work / "trainer-transformer" / "tmp").glob("__autograph_generated_file*"))
    for key in (
        "vs_tfx_example",
        "input_efficiency",
        "fused_vs_unfused",
        "trimmed_vs_untrimmed",
        "reader_vs_tfx_bsl",
        "vs_strong_fit",
    ):
        entry = result[key]
        assert len(entry["paired"]) == TRAINER.repeats
        assert entry["ratio"] == pytest.approx(
            entry[entry["numerator"]]["median"] / entry[entry["denominator"]]["median"]
        )
    assert result["window_steps"] == result["baseline_window_steps"] == 2  # the same window
    assert result["input_efficiency"]["pairs"]["side_by_side_only"] == 0  # tabular only
    phases = result["phase_seconds"]
    assert set(phases) == {"build_and_warm_up", "alternated_windows", "reader"}
    assert all(seconds > 0 for seconds in phases.values()), phases
    assert result["mfu"]["ours_ceiling_dtype"] == "float32"
    # The ceiling was a contender: one sample per repetition, each MFU over its neighbour.
    ceiling = result["matmul_ceiling"]["float32"]
    assert len(ceiling["samples"]) == TRAINER.repeats
    mfu, flops = result["mfu"], result["flops_per_example"]["training"]
    untrimmed = result["trimmed_vs_untrimmed"]["ours_untrimmed"]
    assert mfu["ours"] == pytest.approx(untrimmed["median"] * flops / ceiling["flops_per_second"])
    assert mfu["tfx_example"] == pytest.approx(
        result["vs_tfx_example"]["tfx_example"]["median"] * flops / ceiling["flops_per_second"]
    )
    paired = [r * flops / c for r, c in zip(untrimmed["values"], ceiling["samples"], strict=True)]
    assert mfu["ours_paired"] == pytest.approx(paired)
    assert mfu["ours_paired_median"] == pytest.approx(statistics.median(paired))
    assert (mfu["ours_paired_min"], mfu["ours_paired_max"]) == (min(paired), max(paired))
    # Every synthetic text fills its 12 tokens: nothing to cut. MFU comes from the untrimmed
    # loop, the one that computes the FLOPs it is credited with.
    assert result["trimmed_length"] == {"mean": 12, "min": 12, "max": 12, "full": 12}
    assert result["mfu"]["ours_contender"] == "ours_untrimmed"
    # The advisor's band is its own split's (no cached-input figure of the benchmark's covers a
    # float32 Transformer), and the split adds up.
    advisor = result["advisor"]
    assert advisor["input_wait_fraction"] == pytest.approx(
        advisor["input_wait_ms"] / advisor["step_time_ms"], abs=1e-3
    )
    assert advisor["compute_ms"] == pytest.approx(
        advisor["step_time_ms"] - advisor["input_wait_ms"], abs=1e-3
    )
    assert advisor["classification"] == classify(advisor["input_wait_fraction"])
    assert advisor["precision_policy"] == result["precision_policy"] == "float32"
    # The advisor row reports the reader's ceiling as measured on these files.
    assert result["advisor"]["reader_ceiling_measured"] is True
    assert result["advisor"]["reader_ceiling_examples_per_second"] == round(
        result["reader_vs_tfx_bsl"]["ours"]["median"]
    )
    reader = result["reader_vs_tfx_bsl"]
    assert reader["headroom_vs_training"] == pytest.approx(
        reader["ours"]["median"] / result["vs_tfx_example"]["ours"]["median"]
    )


def test_trainer_benchmark_process_failure_is_reported(text_data, tmp_path):
    missing = dataclasses.replace(text_data, train_files=(str(tmp_path / "gone.gz"),))
    with pytest.raises(RuntimeError, match="transformer trainer benchmark process exited 1"):
        trainer_bench.measure_model_in_process(
            tmp_path, missing, TINY_TRANSFORMER, TRAINER, 3, "transformer"
        )
    assert "Traceback" in (tmp_path / "trainer-transformer" / "stderr.log").read_text()


def test_reader_rates_alternate_both_readers(text_data):
    readers = reader_rates(
        text_data, TINY_TRANSFORMER, batches=TRAINER.reader_batches, repeats=TRAINER.repeats
    )
    assert set(readers) == {"ours", "tfx_bsl", "ours_per_cpu_second"} and all(
        len(v) == TRAINER.repeats for v in readers.values()
    )


def test_tabular_trainer_benchmark_times_fit_in_its_own_window(tmp_path):
    # The tabular `fit` baseline gets its own (shorter) window; ratios stay per-second rates.
    data = write_synthetic_training_data(tmp_path / "tabular", rows=64, numeric=3)
    config = dataclasses.replace(TINY_TRANSFORMER, model="tabular")
    sizes = dataclasses.replace(
        TRAINER,
        tabular_baseline_window_steps=4,
        tabular_input_pairs=3,
        tabular_input_window_steps=6,
    )
    result = model_process.trainer_model(data, config, sizes, 10, "tabular")
    assert result["window_steps"] == 10 and result["baseline_window_steps"] == 4
    assert len(result["vs_tfx_example"]["paired"]) == TRAINER.tabular_repeats
    # Input efficiency pools the repetitions' pairs with its own side-by-side pairs.
    efficiency = result["input_efficiency"]
    assert len(efficiency["paired"]) == TRAINER.tabular_repeats + 3
    assert (
        efficiency["ours"]["n"] == efficiency["ours_in_memory"]["n"] == TRAINER.tabular_repeats + 3
    )
    assert efficiency["pairs"] == {
        "with_every_contender": TRAINER.tabular_repeats,
        "side_by_side_only": 3,
        "side_by_side_window_steps": 6,
    }
    for key in ("vs_tfx_example", "input_efficiency"):
        entry = result[key]
        assert entry["ratio"] == pytest.approx(
            entry[entry["numerator"]]["median"] / entry[entry["denominator"]]["median"]
        )
    assert efficiency["input_cached"] is True  # `cache: auto` on 64 rows: cached
    assert "fused_vs_unfused" not in result and "trimmed_vs_untrimmed" not in result
    assert result["phase_seconds"]["input_efficiency_pairs"] > 0

    # More pairs from a fresh process of its own (Sizes.tabular_input_processes), pooled; each
    # process keeps its own paired median for the verdict.
    more = dataclasses.replace(sizes, tabular_input_processes=1)
    trainer_bench.measure_input_runs(tmp_path / "work", data, config, more, result, "tabular")
    pooled = result["input_efficiency"]
    own_pairs = TRAINER.tabular_repeats + 3
    assert len(pooled["paired"]) == pooled["ours"]["n"] == own_pairs + 3
    assert pooled["paired"][:own_pairs] == efficiency["paired"]  # the model process's first
    assert [run["pairs"] for run in pooled["runs"]] == [own_pairs, 3]
    assert pooled["runs"][0]["paired_median"] == efficiency["paired_median"]
    assert pooled["pairs"]["more_processes"] == 1
    assert pooled["input_cached"] is True  # what the advisor's cached-input figure rests on
    assert pooled["pairs"]["side_by_side_per_more_process"] == 3
    assert result["phase_seconds"]["input_efficiency_processes"] > 0
    log = (tmp_path / "work" / "trainer-tabular-input-1" / "stderr.log").read_text()
    assert "Traceback" not in log


def test_a_failed_input_efficiency_process_keeps_the_model_process_results(tmp_path):
    data = write_synthetic_training_data(tmp_path / "tabular", rows=64, numeric=3)
    missing = dataclasses.replace(data, train_files=(str(tmp_path / "gone.gz"),))
    config = dataclasses.replace(TINY_TRANSFORMER, model="tabular")
    own = ratio_entry(
        {"ours": [1.0, 0.9, 1.1], "ours_in_memory": [1.0] * 3}, "ours", "ours_in_memory"
    )
    entry = {"input_efficiency": dict(own), "phase_seconds": {}}
    sizes = dataclasses.replace(TRAINER, tabular_input_processes=1, tabular_input_pairs=2)
    trainer_bench.measure_input_runs(tmp_path / "work", missing, config, sizes, entry, "tabular")
    efficiency = entry["input_efficiency"]
    assert "input efficiency process 1 exited 1" in efficiency["more_processes_error"]
    assert {k: v for k, v in efficiency.items() if k != "more_processes_error"} == own
    assert "runs" not in efficiency and entry["phase_seconds"] == {}


def test_input_efficiency_is_decided_only_when_every_process_agrees():
    def run(*paired):
        return {"ours": list(paired), "ours_in_memory": [1.0] * len(paired)}

    def verdict(runs):
        entry = ratio_entry(runs[0], "ours", "ours_in_memory")
        entry["pairs"] = {"with_every_contender": len(runs[0]["ours"])}
        pooled = trainer_bench.pool_input_runs(entry, runs[1:])
        results = {"trainer": {"tabular": {"input_efficiency": pooled}}}
        (target,) = [t for t in verdicts.judge(results) if t["name"] == "tabular_input_efficiency"]
        return pooled, target

    high = [0.99 + 0.001 * i for i in range(20)]  # each run's interval wholly above 0.97
    low = [0.95 + 0.001 * i for i in range(20)]  # ... wholly below
    pooled, target = verdict([run(*high), run(*high), run(*high)])
    assert len(pooled["paired"]) == 60 and [r["pairs"] for r in pooled["runs"]] == [20] * 3
    assert target["met"] and target["runs_agree"] and target["decided"]
    # Two runs above and one below: the pooled interval (40 of 60 pairs above) is above the
    # line, but the runs disagree, so no verdict.
    pooled, target = verdict([run(*high), run(*low), run(*high)])
    assert pooled["paired_interval"]["low"] >= 0.97 and target["met"]
    assert target["runs_agree"] is False and target["decided"] is False
    assert target["run_paired_medians"] == pytest.approx([1.0, 0.96, 1.0], abs=0.001)
    assert verdicts.verdict_text(target) == (
        ">= 0.97: met (undecided: its 3 processes' paired medians (1.000, 0.960, 1.000) fall on "
        "both sides of the line: the runs differ by more than one run's noise)"
    )
    # One run (no more processes): decided on its interval alone, as before.
    pooled, target = verdict([run(*low)])
    assert "runs_agree" not in target and target["decided"] and not target["met"]
    assert verdicts.verdict_text(target) == ">= 0.97: NOT met"
    # An interval across the line and disagreeing runs: both reasons are named.
    mixed = [0.965 + 0.001 * i for i in range(10)]
    pooled, target = verdict([run(*mixed), run(*high), run(*low)])
    assert not target["decided"] and target["runs_agree"] is False
    text = verdicts.verdict_text(target)
    assert "contains the line; its 3 processes' paired medians" in text, text


def test_tracking_benchmark_runs_train_with_and_without_mlflow(text_data, tmp_path):
    from mlflow.tracking import MlflowClient

    config = dataclasses.replace(
        TINY_TRANSFORMER, model="tabular", train_steps=9, checkpoint_every_steps=0
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    measured = tracking_rates(text_data, config, tracking_uri=uri, repeats=1)
    assert set(measured["samples"]) == {"off", "on"}
    # The "on" contender really tracked: its Trainer run has the loop metrics.
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("fullthrottle-bench").experiment_id])
    assert any(r.data.metrics.get("train/examples_per_second") for r in runs)
    # ...and reported what tracking itself cost (its CPU share of the window between loop ends).
    (cpu,) = measured["cpu"]
    assert cpu["hook"] > 0 and 0 < cpu["fraction"] < 1
    assert any(0 < r.data.metrics.get("tracking/cpu_fraction", 0) < 1 for r in runs)


def test_in_memory_contender_trains_ours_model_through_ours_compiled_loop(tmp_path):
    data = write_synthetic_training_data(tmp_path / "tabular", rows=64, numeric=3)
    config = TrainingConfig(model="tabular", per_replica_batch_size=8, steps_per_loop=4)
    ours = OurLoop(data, config)
    ours.measure(8)
    memory = OurLoop(data, config, source="memory", memory_batches=2, same_model_as=ours)
    memory.fill_cache()
    before = [v.numpy().copy() for v in ours.model.trainable_variables]
    assert memory.measure(8) > 0
    # One model: the in-memory windows trained ours' weights...
    assert memory.model is ours.model
    after = [v.numpy() for v in ours.model.trainable_variables]
    assert any((a != b).any() for a, b in zip(before, after, strict=True))
    # ...through the loop traced for ours: its batches have the same spec, so no second trace.
    assert ours.loop.train_loop.experimental_get_tracing_count() == 1
    with pytest.raises(ValueError, match="same config"):
        OurLoop(data, dataclasses.replace(config, steps_per_loop=2), same_model_as=ours)


def test_window_steps_fill_the_window_in_whole_steps():
    assert model_process.window_steps(0.47, 1.5) == 3  # a float32 Transformer step on 2 AVX2 cores
    assert model_process.window_steps(0.08, 1.5) == 19  # a bf16 one on AVX512_BF16
    assert model_process.window_steps(5.0, 1.5) == 2  # never fewer than 2


def test_quick_mode_skips_beam_scaling_and_the_checkpoint_lever_and_says_so(tmp_path):
    context = Context(work=tmp_path, results={}, log=lambda m: None)
    skipped = beam.run(context, beam.BENCHMARK.quick)
    assert "quick mode runs no Beam scaling point" in skipped["skipped"]
    skipped = checkpoints.run(context, checkpoints.BENCHMARK.quick)
    assert "quick mode runs no checkpoint lever" in skipped["skipped"]
    assert list(tmp_path.iterdir()) == []  # nothing was generated or run


@pytest.mark.slow
def test_beam_benchmark_and_results_document(tmp_path, monkeypatch):
    """The pipeline's data steps on DirectRunner's multi_processing mode (the option path a
    distributed runner uses: Beam arguments, SDK worker processes), the benchmark's rows and its
    results document."""
    # No work_dir: the suite's temp work folder is removed after a run where nothing failed;
    # with it go the copies of TFX that TFX packages for every Beam component given Beam
    # arguments (docs/scaling.md), and nothing at all is left in the temp folder.
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    document = suite.run_suite(sizes=TINY, mode="tiny", only=("beam",), log=lambda m: None)
    assert document["work_dir"] is None and list(temp.iterdir()) == []
    beam = document["results"]["beam"]
    assert "error" not in beam, beam.get("trace")
    (point,) = beam["points"]
    assert point["rows"] == 120 and point["workers"] == 1 and point["rows_per_second"] > 0
    assert point["transform_seconds"] > 0 and point["example_gen_seconds"] > 0
    assert point["staging_seconds"] > 0
    # Stock CsvExampleGen and the Arrow ExampleGen, each timed on the same staged files.
    pair = beam["example_gens"]
    assert pair["rows"] == 120 and pair["stock_seconds"] > 0 and pair["arrow_seconds"] > 0
    # Targets not measured in this run are reported as unknown, never as met.
    assert all(t["met"] is None for t in document["targets"])
    json_path, md_path = write_results(document, tmp_path / "results")
    again, _ = write_results(document, tmp_path / "results")
    assert (
        again != json_path
        and json.loads(json_path.read_text())["results"]["beam"]["points"][0]["rows"] == 120
    )
    text = md_path.read_text()
    assert "Beam: ExampleGen + Transform, 120 rows, 1 worker(s)" in text
    assert "Beam: ExampleGen, stock CsvExampleGen vs Arrow, 120 rows, 1 worker(s)" in text
    per_step = next(line for line in text.splitlines() if "Beam: rows/s per step" in line)
    for step in ("staging", "ExampleGen", "StatisticsGen", "DataGate", "Transform"):
        assert f"{step} " in per_step, per_step


def _run_document(results: dict, *, date: str, commit: str, mode: str, bf16: bool) -> dict:
    """A results document as `run_suite` returns it, with these readings."""
    return {
        "date": date,
        "mode": mode,
        "command": "fullthrottle bench" + (" --quick" if mode == "quick" else ""),
        "git_commit": commit,
        "machine": {"cpu": "EPYC", "cpu_count": 2, "cpu_bf16": bf16, "gpus": [], "tensorflow": "t"},
        "suite_seconds": 1.0,
        "results": results,
        "targets": verdicts.judge(results),
    }


def _tracking_reading(paired: list[float]) -> dict:
    entry = ratio_entry({"on": paired, "off": [1.0] * len(paired)}, "on", "off")
    return {**entry, "train_steps": 100, "bench_seconds": 9.0}


def test_a_partial_run_merges_into_latest_and_keeps_the_other_readings(tmp_path):
    beam = {
        "points": [
            {
                "rows": 120,
                "workers": 1,
                "example_gen_seconds": 1.0,
                "transform_seconds": 2.0,
                "rows_per_second": 40.0,
            }
        ],
        "two_vs_one_workers": {},
        "bench_seconds": 5.0,
    }
    missed = _tracking_reading([0.93 + 0.001 * i for i in range(13)])  # decided: NOT met
    full = _run_document(
        {"tracking": missed, "beam": beam},
        date="2030-01-01T10:00:00+00:00",
        commit="aaaaaaa",
        mode="full",
        bf16=True,
    )
    results = tmp_path / "results"
    first, _ = write_results(full, results)
    # A later `--only tracking --only beam` where Beam was skipped: tracking measured again.
    met = _tracking_reading([0.99 + 0.001 * i for i in range(13)])  # decided: met
    partial = _run_document(
        {"tracking": met, "beam": {"skipped": "no workers", "bench_seconds": 0.0}},
        date="2030-01-02T10:00:00+00:00",
        commit="bbbbbbb",
        mode="full",
        bf16=False,
    )
    second, _ = write_results(partial, results)
    assert (first.stem, second.stem) == ("2030-01-01T100000Z", "2030-01-02T100000Z")
    assert first.exists() and second.exists()  # each run keeps its own file
    # A quick run's reading is written to its own file but never replaces a full reading.
    quick = _run_document(
        {"tracking": missed},
        date="2030-01-02T11:00:00+00:00",
        commit="qqqqqqq",
        mode="quick",
        bf16=False,
    )
    third, _ = write_results(quick, results)
    assert third.exists()

    latest = json.loads((results / "LATEST.json").read_text())
    assert latest["results"] == {"tracking": met, "beam": beam}  # Beam's earlier reading stays
    source = latest["provenance"]
    assert (
        source["beam"]["results_file"] == first.stem and source["beam"]["git_commit"] == "aaaaaaa"
    )
    assert source["tracking"]["results_file"] == second.stem
    assert (source["tracking"]["git_commit"], source["tracking"]["mode"]) == ("bbbbbbb", "full")
    assert source["beam"]["machine"]["cpu_bf16"] is True
    assert source["tracking"]["machine"]["cpu_bf16"] is False
    assert source["tracking"]["date"] == "2030-01-02T10:00:00+00:00"
    # The targets are judged on the merged readings: tracking's newest, met.
    verdict = {t["name"]: t for t in latest["targets"]}["tracking_on_vs_off"]
    assert verdict["met"] and verdict["decided"]
    assert verdict["measured"] == pytest.approx(met["paired_median"])

    # LATEST.md is the renderer's output for LATEST.json: the same rows as a run's table.
    text = (results / "LATEST.md").read_text()
    assert text == latest_markdown(latest)
    assert results_table(latest["results"], latest["targets"]) in text
    assert "| beam | 2030-01-01T100000Z | full | aaaaaaa | 2030-01-01T10:00:00+00:00 | 5 |" in text
    assert "| tracking | 2030-01-02T100000Z | full | bbbbbbb |" in text
    assert "Beam: ExampleGen + Transform, 120 rows, 1 worker(s)" in text
    assert ">= 0.98: met |" in text

    # A benchmark that fails is its newest reading: it replaces the earlier one, named as such.
    broken = _run_document(
        {"beam": {"error": "RuntimeError: boom", "bench_seconds": 1.0}},
        date="2030-01-03T10:00:00+00:00",
        commit="ccccccc",
        mode="full",
        bf16=True,
    )
    write_results(broken, results)
    latest = json.loads((results / "LATEST.json").read_text())
    assert latest["results"]["beam"]["error"] == "RuntimeError: boom"
    assert latest["results"]["tracking"] == met
    assert latest["provenance"]["beam"]["git_commit"] == "ccccccc"
    assert "| beam: FAILED | RuntimeError: boom |" in (results / "LATEST.md").read_text()


def test_the_committed_latest_results_are_generated_from_their_json():
    results = REPO / "bench" / "results"
    latest = json.loads((results / "LATEST.json").read_text(encoding="utf-8"))
    # Every benchmark has a reading, and each says where it came from.
    assert list(latest["results"]) == list(BENCHMARKS)
    assert list(latest["provenance"]) == list(BENCHMARKS)
    for source in latest["provenance"].values():
        assert source["results_file"] and source["git_commit"] and source["machine"]["cpu"]
    # The verdicts are the current rules applied to the readings, and the table is rendered
    # from them: a hand-edited LATEST.md (or JSON verdict) fails here.
    assert latest["targets"] == verdicts.judge(latest["results"])
    assert (results / "LATEST.md").read_text(encoding="utf-8") == latest_markdown(latest)


def test_git_keeps_only_the_latest_results():
    def ignored(name):
        done = subprocess.run(
            ["git", "check-ignore", "-q", "--no-index", f"bench/results/{name}"],
            cwd=REPO,
            check=False,
        )
        if done.returncode not in (0, 1):
            pytest.skip("not a git checkout")
        return done.returncode == 0

    assert ignored("2030-01-01T100000Z.json") and ignored("2030-01-01T100000Z-2.md")
    assert not ignored("LATEST.json") and not ignored("LATEST.md")


def test_the_docs_blocks_are_rewritten_from_latest_and_nothing_else():
    latest = {
        "results": {"pipeline": {"wall_seconds": 66.4}},
        "provenance": {},
        "targets": [],
    }
    page = (
        "# Title\n\nThe run took <!-- bench:pipeline-wall -->9 s<!-- /bench:pipeline-wall -->.\n"
        "<!-- bench:targets -->\nold table\n<!-- /bench:targets -->\nmore prose\n"
    )
    new = docs.render_page(page, latest)
    assert "The run took <!-- bench:pipeline-wall -->66 s<!-- /bench:pipeline-wall -->." in new
    table = docs.targets_table(latest)
    assert f"<!-- bench:targets -->\n\n{table}\n<!-- /bench:targets -->\nmore prose\n" in new
    assert docs.render_page(new, latest) == new  # rendering is idempotent
    assert docs.blocks_in(new) == ["pipeline-wall", "targets"]
    assert "old table" not in new and "old table" in page
    with pytest.raises(ValueError, match="unknown generated block `bench:nope`"):
        docs.render_page("<!-- bench:nope -->x<!-- /bench:nope -->", latest)
    # A figure LATEST.json has no reading for is an error, not an empty block.
    with pytest.raises(KeyError, match="beam/two_vs_one_workers"):
        docs.render_page("<!-- bench:beam-scaling -->x<!-- /bench:beam-scaling -->", latest)


def test_a_failed_benchmark_keeps_the_temp_work_folder_for_its_logs(tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    broken = {**TINY, "beam": dataclasses.replace(TINY["beam"], workers=(-1,))}  # refused
    document = suite.run_suite(sizes=broken, mode="tiny", only=("beam",), log=lambda m: None)
    assert "direct_num_workers" in document["results"]["beam"]["error"]
    work = Path(document["work_dir"])
    assert work.parent == temp and (work / "beam").is_dir()


def test_tracking_and_checkpoint_benchmarks_alone_make_their_own_data(tmp_path):
    # `fullthrottle bench --only tracking --only checkpoints` (no pipeline benchmark to take the
    # data from) runs the pipeline's prefix up to Transform itself, once, as the trainer
    # benchmark does. Three loops of the default steps_per_loop: the timed span is from loop 1's
    # end to the last.
    loops = 3 * TrainingConfig().steps_per_loop
    sizes = {
        **TINY,
        "tracking": dataclasses.replace(TINY["tracking"], train_steps=loops),
        "checkpoints": dataclasses.replace(TINY["checkpoints"], train_steps=loops, repeats=1),
    }
    document = suite.run_suite(
        sizes=sizes,
        mode="tiny",
        work_dir=tmp_path / "work",
        only=("tracking", "checkpoints"),
        log=lambda m: None,
    )
    tracking = document["results"]["tracking"]
    assert "error" not in tracking, tracking.get("trace")
    assert len(tracking["paired"]) == TINY["tracking"].repeats
    assert tracking["on"]["median"] > 0 and tracking["off"]["median"] > 0
    assert (tmp_path / "work" / "tabular" / "metadata").is_dir()
    # Tracking's own CPU time over the timed window: the hook ran after every loop.
    cpu = tracking["tracking_cpu"]
    assert cpu["hook"] > 0 and cpu["wall_seconds"] > 0 and 0 < cpu["fraction"] < 1
    # ...and its direct cost: the hook's wall time plus the other threads' CPU (which can run
    # on the other core at the same time, so over a window this short it may pass 100%).
    assert cpu["direct_fraction"] >= cpu["hook_wall"] / cpu["wall_seconds"] > 0
    assert "tracking: its own CPU time while training" in markdown_table(document)

    # Traced vs eager periodic saves, both through the real train(): each ran, each saved.
    checkpoints = document["results"]["checkpoints"]
    assert "error" not in checkpoints, checkpoints.get("trace")
    assert len(checkpoints["paired"]) == 1
    assert checkpoints["traced"]["median"] > 0 and checkpoints["eager"]["median"] > 0
    assert checkpoints["saves"] == {"traced": ["traced"], "eager": ["eager"]}
    # The default cadence (a save every 100 steps) falls inside these 3 x 50 steps.
    assert checkpoints["checkpoint_every_steps"] < loops
    assert all(0 < share < 1 for share in checkpoints["checkpoint_share"].values())
    assert "checkpoints: periodic saves traced vs eager" in markdown_table(document)


def test_the_strong_fit_gets_ours_model_options_precision_and_dataset(tmp_path):
    """The `fit` contender is ours minus our loop: the model train() builds from the same config
    (options, precision policy, initial weights), steps_per_execution = steps_per_loop, our
    jit_compile, the very dataset object ours trains on, and the same distribution setup: on
    one CPU replica ours iterates the dataset directly, and so does `fit` (its model is outside
    the strategy, so Keras does not wrap the dataset in `experimental_distribute_dataset`)."""
    import numpy as np
    import tensorflow as tf

    data = write_synthetic_training_data(tmp_path / "tabular", rows=64, numeric=3)
    config = dataclasses.replace(TINY_TRANSFORMER, model="tabular", precision="auto")
    ours = OurLoop(data, config)
    fit = StrongFit(data, config, ours)
    assert fit.dataset is ours.dataset
    assert isinstance(ours.dataset, tf.data.Dataset)  # ours: not a distributed dataset
    assert fit.distribution == "direct"
    assert fit.model.distribute_strategy is tf.distribute.get_strategy()  # the default one
    assert not isinstance(fit.model.distribute_strategy, tf.distribute.OneDeviceStrategy)
    for mine, theirs in zip(ours.model.weights, fit.model.weights, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    assert fit.policy == ours.policy
    policies = [layer.dtype_policy.name for layer in fit.model.layers]
    assert policies == [layer.dtype_policy.name for layer in ours.model.layers]
    assert ours.policy in policies
    assert fit.model_options == config.model_options("tabular")
    assert fit.model.count_params() == ours.model.count_params()
    assert [w.shape for w in fit.model.weights] == [w.shape for w in ours.model.weights]
    assert fit.model.steps_per_execution == config.steps_per_loop
    assert fit.model.jit_compile is False  # ours does not XLA-compile unless asked
    assert fit.measure(6) > 0


def test_the_streaming_contender_really_streams_data_past_the_cache_line(tmp_path, monkeypatch):
    from trainer_module.training.inputs import CACHE_AUTO_EXPANSION, CACHE_AUTO_RAM_FRACTION

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data = write_synthetic_training_data(tmp_path / "tabular", rows=64, numeric=3)
    config = dataclasses.replace(TINY_TRANSFORMER, model="tabular")
    result = model_process.measure_streaming(data, config, TRAINER)
    assert result["rows"] == TRAINER.streaming_rows and result["files"] == 2
    for size in model_process.STREAMING_BATCH_SIZES:
        entry = result[f"b{size}"]
        assert len(entry["paired"]) == TRAINER.streaming_repeats
        assert entry["numerator"] == "streaming" and entry["denominator"] == "in_memory"
        prebatched = result[f"b{size}_prebatched"]
        assert len(prebatched["paired"]) == TRAINER.streaming_repeats
        assert prebatched["numerator"] == "prebatched"
        # Every timed window's CPU use, per contender (see test_metered_windows_record_...).
        assert set(entry["cpu"]) == {"streaming", "in_memory"}
        assert set(prebatched["cpu"]) == {"prebatched", "in_memory"}
        for cpu in (*entry["cpu"].values(), prebatched["cpu"]["prebatched"]):
            assert set(cpu) == set(CPU_METRICS)
            assert cpu["cores"]["n"] == TRAINER.streaming_repeats
            assert cpu["cores"]["median"] > 0 and cpu["cpu_us_per_example"]["median"] > 0
    assert result["reader"]["per_cpu_second"]["median"] > 0
    reader = result["reader_prebatched"]
    assert reader["per_cpu_second"]["median"] > 0 and reader["write_seconds"] > 0
    # One pre-batched copy per training file, which the contenders read; the timed rewrite's
    # folder is gone.
    copies = list((Path(result["examples_uri"]) / "prebatched").glob("*.prebatched.gz"))
    assert len(copies) == result["files"] and reader["bytes"] == sum(
        p.stat().st_size for p in copies
    )
    assert not (Path(result["examples_uri"]) / "prebatched-timed").exists()
    # The full bench's files: past `cache: auto`'s line on the 24 GiB machines this runs on.
    bytes_per_row = result["bytes"] / result["rows"]
    line = CACHE_AUTO_RAM_FRACTION * 24 * 2**30 / CACHE_AUTO_EXPANSION
    assert bytes_per_row * trainer_bench.BENCHMARK.full.streaming_rows > line
    # The generated files are reused, not written again.
    from fullthrottle.bench.workloads import streaming_tabular_data

    stamps = [Path(f).stat().st_mtime_ns for f in result_files(result)]
    streaming_tabular_data(data, rows=TRAINER.streaming_rows, files=TRAINER.streaming_files)
    assert [Path(f).stat().st_mtime_ns for f in result_files(result)] == stamps


def test_metered_windows_record_cores_machine_cores_and_cpu_per_example():
    samples: dict[str, list[float]] = {}

    def busy_window() -> float:  # 0.3 s of one thread's CPU, "1,000 examples"
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        return 1000 / 0.3

    for _ in range(2):
        assert metered(busy_window, samples) == 1000 / 0.3
    assert set(samples) == set(CPU_METRICS)
    assert all(len(values) == 2 for values in samples.values())
    metrics = (samples[m] for m in ("cores", "machine_cores", "cpu_us_per_example"))
    for cores, machine, per_example in zip(*metrics, strict=True):
        # One busy thread: at most one core (however little the scheduler granted), and the
        # machine ran at least that (its counters tick every 10 ms: a tolerance of 2 ticks).
        assert 0.05 < cores <= 1.05 and machine >= cores - 0.07
        assert per_example == pytest.approx(cores / (1000 / 0.3) * 1e6, rel=0.05)


def test_streaming_rows_name_the_cores_and_cpu_per_example_when_measured():
    from fullthrottle.bench.benchmarks.trainer import cpu_note

    def cpu(cores, machine, per_example):
        return {
            "cores": {"median": cores},
            "machine_cores": {"median": machine},
            "cpu_us_per_example": {"median": per_example},
        }

    entry = {"cpu": {"streaming": cpu(1.1, 2.0, 4.6), "in_memory": cpu(1.0, 2.0, 2.7)}}
    assert cpu_note(entry, "streaming") == (
        "; cores 1.10 vs 1.00, CPU 4.60 vs 2.70 us/example, the machine's 2.00 cores busy"
    )
    assert cpu_note({}, "streaming") == ""  # a reading from before they were measured


def result_files(result):
    return sorted(str(p) for p in (Path(result["examples_uri"]) / "Split-train").iterdir())


def test_the_streaming_contenders_read_with_the_cache_off(tmp_path, monkeypatch):
    from fullthrottle.bench import trainer

    configs = []
    real = trainer.OurLoop.__init__

    def spy(self, data, config, **kwargs):
        configs.append(config)
        real(self, data, config, **kwargs)

    monkeypatch.setattr(trainer.OurLoop, "__init__", spy)
    data = write_synthetic_training_data(tmp_path / "tabular", rows=64, numeric=3)
    config = dataclasses.replace(TINY_TRANSFORMER, model="tabular", cache="auto")
    trainer.streaming_rates(data, config, batch_sizes=(8,), window_examples=16, repeats=1)
    assert configs and all(c.cache is False for c in configs)


def test_a_failing_target_prints_not_met():
    results = {
        "trainer": {
            "tabular": {
                "streaming": {
                    "b64": ratio_entry(
                        {"streaming": [0.5] * 7, "in_memory": [1.0] * 7}, "streaming", "in_memory"
                    ),
                    "reader": {
                        "per_cpu_second": {
                            "median": 200_000.0,
                            "interval": median_interval([190_000.0 + i for i in range(7)]),
                        }
                    },
                }
            }
        }
    }
    judged = {t["name"]: t for t in verdicts.judge(results)}
    for name in ("tabular_streaming_b64", "tabular_reader_per_core"):
        assert judged[name]["met"] is False and judged[name]["decided"], judged[name]
        assert verdicts.verdict_text(judged[name]).endswith("NOT met")
    assert judged["tabular_streaming_b256"]["met"] is None  # not measured: no verdict


def test_a_benchmark_registered_in_one_place_is_run_judged_tabled_and_documented(monkeypatch):
    """The registry is the one list: a benchmark defined here, added to BENCHMARKS and nowhere
    else, is selectable, run with its own sizes per mode, judged, shown in the table and in
    the docs' targets and sizes tables."""
    from fullthrottle.bench.benchmarks.base import BenchmarkSpec, Target, ratio_reading, size
    from fullthrottle.cli import build_parser

    @dataclasses.dataclass(frozen=True)
    class EchoSizes:
        pairs: int = size(13, "pairs of echoes")

    def run(context, sizes):
        assert context.results["pipeline"]["wall_seconds"] == 1.0  # earlier benchmarks' results
        paired = [0.99 + 0.001 * i for i in range(sizes.pairs)]
        return {"echo": ratio_entry({"a": paired, "b": [1.0] * sizes.pairs}, "a", "b")}

    def rows(result, verdict):
        return [f"| echo: a vs b | | {result['echo']['ratio']:.2f}x | {verdict('echo_a_vs_b')} |"]

    def pipeline(context, sizes):
        return {"wall_seconds": 1.0}

    spec = BenchmarkSpec(
        name="echo",
        summary="a test's benchmark",
        run=run,
        rows=rows,
        full=EchoSizes(),
        quick=EchoSizes(pairs=3),
        targets=(Target("echo_a_vs_b", 0.98, "a / b", ratio_reading("echo")),),
    )
    monkeypatch.setitem(BENCHMARKS, "echo", spec)
    monkeypatch.setitem(
        BENCHMARKS, "pipeline", dataclasses.replace(BENCHMARKS["pipeline"], run=pipeline)
    )
    assert build_parser().parse_args(["bench", "--only", "echo"]).only == ["echo"]
    for mode, pairs, decided in (("full", 13, True), ("quick", 3, False)):
        document = suite.run_suite(
            sizes=suite.sizes_for(mode),
            mode=mode,
            only=("pipeline", "echo"),
            log=lambda m: None,
        )
        assert len(document["results"]["echo"]["echo"]["paired"]) == pairs
        assert document["sizes"]["echo"] == {"pairs": pairs}
        (verdict,) = [t for t in document["targets"] if t["name"] == "echo_a_vs_b"]
        assert verdict["met"] and verdict["decided"] is decided
        row = next(r for r in markdown_table(document).splitlines() if "echo:" in r)
        assert row.startswith("| echo: a vs b | | ") and "x | >= 0.98: met" in row
        assert ("undecided" in row) is not decided
    assert "| echo | `echo_a_vs_b` | 0.98 | a / b |" in docs.targets_table({})
    assert "| echo | `pairs` | 13 | 3 | pairs of echoes |" in docs.sizes_table({})
    with pytest.raises(ValueError, match="no such benchmark"):
        suite.sizes_for("quick", nope={"pairs": 1})


def test_the_transformers_text_is_repeated_through_several_shuffle_windows(tmp_path):
    """The Transformer's streamed input: its small split's records, in order, repeated into as
    many gzip files until they fill the asked rows, and its input row says so."""
    import tensorflow as tf

    from fullthrottle.bench.benchmarks.trainer import model_rows
    from fullthrottle.bench.workloads import repeated_training_data

    data = write_synthetic_training_data(tmp_path / "text", rows=30, numeric=2, seq_len=4)
    split = [r.numpy() for r in tf.data.TFRecordDataset(list(data.train_files), "GZIP")]
    repeated, rows, split_rows = repeated_training_data(
        data, min_rows=100, files=2, directory=tmp_path / "repeated"
    )
    assert (rows, split_rows) == (120, 30) and len(repeated.train_files) == 2
    records = [
        [r.numpy() for r in tf.data.TFRecordDataset([f], "GZIP")] for f in repeated.train_files
    ]
    assert records[0] == split + split and records[1] == split + split
    assert repeated.feature_spec == data.feature_spec

    entry = {"ratio": 0.9, "paired_median": 0.9, "paired_min": 0.8, "paired_max": 1.0}
    entry |= {"paired": [0.9], "ours": {"median": 9.0}, "ours_in_memory": {"median": 10.0}}
    entry |= {"unit": "examples/s", "numerator": "ours", "denominator": "ours_in_memory"}
    m = {
        "precision_policy": "float32",
        "vs_tfx_example": entry | {"tfx_example": {"median": 10.0}, "denominator": "tfx_example"},
        "input_efficiency": entry | {"input_cached": False},
        "input_rows": {"rows": rows, "split_rows": split_rows, "shuffle_buffer_size": 25},
        "mfu": {"ours": 0.1, "tfx_example": 0.05, "ours_ceiling_dtype": "float32"},
        "matmul_ceiling": {"float32": {"flops_per_second": 1e9}},
        "flops_per_example": {"training": 100.0},
    }
    rows_md = model_rows("transformer", m, lambda name: "")
    row = next(r for r in rows_md if "input efficiency" in r)
    assert "120 rows (the 30-row split repeated) through 25-row shuffle windows" in row
    assert "cache row" not in row
    cached = model_rows(
        "tabular", m | {"input_efficiency": entry | {"input_cached": True}}, lambda name: ""
    )
    assert "cache row" in next(r for r in cached if "input efficiency" in r)


def test_the_copies_row_charges_their_write_pass_over_a_runs_epochs():
    """Copies / in-memory with the write pass in it, over 1 and 10 epochs, and the epochs after
    which they beat plain streaming (the advisor's break-even)."""
    from fullthrottle.bench.benchmarks.trainer import copies_cost

    st = {"rows": 1000, "reader_prebatched": {"write_seconds": 1.0}}
    plain = {"streaming": {"median": 250.0}}  # 4 s per epoch
    copies = {"prebatched": {"median": 500.0}, "in_memory": {"median": 1000.0}}  # 2 s, 1 s
    # 1 epoch: 1 s in memory vs 1 + 2 s; 10 epochs: 10 s vs 1 + 20 s; 1 s / (4 - 2 s) = 0.5.
    assert copies_cost(st, plain, copies) == (
        "; with the 1.0 s write pass over 1,000 rows: 1 epoch 0.33x, 10 epochs 0.48x; "
        "paid back vs plain streaming after 0.5 epochs"
    )
    slower = {"prebatched": {"median": 200.0}, "in_memory": {"median": 1000.0}}
    assert copies_cost(st, plain, slower).endswith("never paid back vs plain streaming")
    assert copies_cost({"rows": 1000}, plain, copies) == ""  # no write pass measured


def test_the_loop_vs_fit_figure_says_when_fit_paid_for_an_iterator_ours_skips():
    def latest(fit: dict) -> dict:
        entry = {"ratio": 1.2, "paired_median": 1.1, "fit": fit}
        entry["paired_interval"] = {"coverage": 0.9, "low": 1.0, "high": 1.3}
        return {
            "results": {
                "trainer": {m: {"vs_strong_fit": entry} for m in ("transformer", "tabular")}
            }
        }

    equal = docs.loop_vs_fit(latest({"distribution": "direct"}))
    assert (
        equal
        == "transformer 1.10x (90% interval 1.00-1.30), tabular 1.10x (90% interval 1.00-1.30)"
    )
    old = docs.loop_vs_fit(latest({"policy": "float32"}))
    assert old.count("`fit` paying for a distributed iterator ours skips") == 2


def test_ingest_benchmark_parquet_vs_csv_and_first_run_parts(tmp_path, penguins_run):
    """The ingest rows on tiny sizes: the same rows as CSV and as Parquet, each staged and read
    by the Arrow ExampleGen; the first run's parts (the Trainer's time to its first loop, read
    from a real run; a fresh process's peak RSS); the rows and the target's reading."""
    from fullthrottle.bench.benchmarks import ingest
    from fullthrottle.bench.workloads import (
        in_child,
        trainer_first_step_seconds,
        write_tabular_csv,
    )
    from fullthrottle.core.staging import prepare_data
    from fullthrottle.outcome import read_latest_run

    context = Context(work=tmp_path, results={}, log=lambda m: None)
    assert (
        "quick mode runs no ingest point" in ingest.run(context, ingest.BENCHMARK.quick)["skipped"]
    )
    # In-memory Beam (workers 0): no worker process to start for 300 rows.
    sizes = ingest.IngestSizes(rows=300, first_run_rows=0, workers=0)
    result = ingest.run(context, sizes)
    pair = result["formats"]
    for data_format in ("csv", "parquet"):
        side = pair[data_format]
        assert side["staged_rows"] == 300, side
        assert side["staging_seconds"] > 0 and side["example_gen_seconds"] > 0
    assert sorted(p.name for p in (tmp_path / "ingest" / "formats-300").iterdir()) == [
        "data.csv", "data.parquet", "example-gen-csv", "example-gen-parquet", "run-csv",
        "run-parquet",
    ]  # fmt: skip

    # The Trainer's first loop ends after it starts and before it ends (the penguins run).
    output_dir, _ = penguins_run
    mlmd = str(output_dir / "metadata" / "fullthrottle-penguins.sqlite")
    first_step = trainer_first_step_seconds(mlmd)
    trainer = read_latest_run(mlmd).components["Trainer"]
    assert 0 < first_step < trainer.seconds

    # Staging 20k rows in a fresh process: its result comes back, with the peak RSS.
    cfg = ingest.ingest_config(
        tmp_path / "child", write_tabular_csv(tmp_path / "c.csv", 20_000), "csv", 1, "x"
    )
    prepared, peak = in_child(prepare_data, cfg, job=tmp_path / "job")
    assert prepared.rows == 20_000 and 50 * 2**20 < peak < 16 * 2**30

    point = {
        "rows": 20_000,
        "workers": 1,
        "step_seconds": {"staging": 1.4, "ExampleGen": 3.0, "StatisticsGen": 2.0,
                         "DataGate": 1.0, "Transform": 5.0, "Trainer to the first step": first_step},
        "total_seconds": 12.4 + first_step,
        "peak_rss_bytes": peak,
        "end_to_end_rows_per_second": 20_000 / 10.0,
    }  # fmt: skip
    (target,) = ingest.BENCHMARK.targets
    assert target.read({**result, "first_run": point}).value == 2_000.0
    assert target.read(result) is None  # no first run, no reading
    pair_row, run_row = ingest.rows({**result, "first_run": point}, lambda name: f"v:{name}")
    assert pair_row.startswith("| Ingest: ExampleGen, Parquet vs CSV, 300 rows, 0 worker(s) | ")
    assert "| Ingest: first run to the first training step, 20,000 CSV rows" in run_row
    assert "staging 1 s, ExampleGen 3 s" in run_row and f"v:{target.name} |" in run_row
