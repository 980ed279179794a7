"""Model validation as TFX does it: the Evaluator compares the new model with the latest blessed
model of the pipeline, and only a model that passes is pushed and becomes MLflow's `champion`.

The rule's TFMA config is checked with TFMA's own validator (the code TFX's Evaluator runs to
bless); the whole behaviour with two real runs of the pipeline on one output folder: the
session's good run (copied), then one trained for a single step, while `fullthrottle serve`
serves the good model from that folder.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import shutil
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow_model_analysis as tfma
from mlflow.tracking import MlflowClient
from tensorflow_model_analysis.evaluators import metrics_validator
from tensorflow_model_analysis.metrics import metric_types
from tfx import v1 as tfx
from tfx.dsl.components.common.resolver import RESOLVER_STRATEGY_CLASS

from fullthrottle.bench.serving import free_port, start_server, stop_server
from fullthrottle.core.config import load_config
from fullthrottle.core.evaluation import BlessingRule, PrimaryMetric, explain
from pipelines.pipeline import BASELINE_RESOLVER, create_pipeline, eval_config, tfma_eval_config
from tests.helpers import eval_split_examples, last_run, run_cli, served_dirs, strip_label

ACCURACY = "sparse_categorical_accuracy"


def _verdict(config: tfma.EvalConfig, name: str, candidate: float, baseline: float | None):
    """TFMA's own validation of `candidate` (and `baseline`), as TFX's Evaluator runs it, on
    metrics reported in float32 as Keras computes them. Returns (ok, failed threshold kinds)."""
    config = tfma.utils.update_eval_config_with_defaults(
        config, has_baseline=baseline is not None, rubber_stamp=True
    )
    model = "candidate" if baseline is not None else ""
    value = np.float32(candidate)
    metrics = {metric_types.MetricKey(name=name, model_name=model, example_weighted=False): value}
    if baseline is not None:
        reference = np.float32(baseline)
        metrics[
            metric_types.MetricKey(name=name, model_name="baseline", example_weighted=False)
        ] = reference
        metrics[
            metric_types.MetricKey(
                name=name, model_name=model, example_weighted=False, is_diff=True
            )
        ] = value - reference
    result = metrics_validator.validate_metrics(((), metrics), config)
    kinds = sorted(
        "change" if failure.metric_threshold.HasField("change_threshold") else "value"
        for per_slice in result.metric_validations_per_slice
        for failure in per_slice.failures
    )
    return result.validation_ok, kinds


def test_thresholds_are_applied_exactly_as_written():
    config = eval_config(load_config(overrides=["evaluation.accuracy_threshold=0.399"]))
    # An accuracy of exactly 0.399 meets 0.399, although float32(0.399) < 0.399 in doubles.
    assert _verdict(config, ACCURACY, 0.399, None) == (True, [])
    assert _verdict(config, ACCURACY, 0.398, None) == (False, ["value"])
    # With a baseline: no worse than it passes, any drop fails (tolerance 0 by default).
    assert _verdict(config, ACCURACY, 0.9, 0.9) == (True, [])
    assert _verdict(config, ACCURACY, 0.95, 0.9) == (True, [])
    assert _verdict(config, ACCURACY, 0.8837, 0.8953) == (False, ["change"])
    assert _verdict(config, ACCURACY, 0.2, 0.9) == (False, ["change", "value"])
    tolerant = eval_config(load_config(overrides=["evaluation.baseline_tolerance=0.02"]))
    assert _verdict(tolerant, ACCURACY, 0.88, 0.89) == (True, [])
    assert _verdict(tolerant, ACCURACY, 0.86, 0.89) == (False, ["change"])
    # Without a baseline the change threshold is not applied (TFX's rubber stamp) ...
    assert _verdict(tolerant, ACCURACY, 0.81, None) == (True, [])
    # ... and with `evaluation.baseline: none` it is not even configured.
    alone = eval_config(load_config(overrides=["evaluation.baseline=none"]))
    assert _verdict(alone, ACCURACY, 0.81, 0.99) == (True, [])


def test_a_lower_is_better_metric_gets_an_upper_bound_and_the_opposite_direction():
    # How a task whose primary metric is an error plugs in: the same rule, the other direction.
    error = PrimaryMetric(
        tfma_class="MeanSquaredError",
        key="mean_squared_error",
        higher_is_better=False,
        bound_field="evaluation.error_threshold",
    )
    rule = BlessingRule(task="regression", metric=error, bound=2.5, baseline_tolerance=0.1)
    config = tfma_eval_config(rule, label_key="y_xf", prediction_key="predictions", reported=())
    (threshold,) = [
        m.threshold for m in config.metrics_specs[0].metrics if m.class_name == "MeanSquaredError"
    ]
    assert threshold.value_threshold.HasField("upper_bound")
    assert not threshold.value_threshold.HasField("lower_bound")
    assert threshold.change_threshold.direction == tfma.MetricDirection.LOWER_IS_BETTER
    assert threshold.change_threshold.absolute.value == pytest.approx(0.1)
    assert _verdict(config, "mean_squared_error", 2.5, None) == (True, [])
    assert _verdict(config, "mean_squared_error", 2.6, None) == (False, ["value"])
    assert _verdict(config, "mean_squared_error", 2.0, 1.95) == (True, [])
    assert _verdict(config, "mean_squared_error", 2.2, 1.95) == (False, ["change"])
    reason = explain(rule, candidate=2.2, baseline=1.95, missed_bound=False, missed_baseline=True)
    assert "worse by 0.2500 (lower is better)" in reason, reason


def test_a_regression_config_is_judged_on_mae_with_an_upper_bound_and_lower_is_better():
    config = load_config(
        overrides=[
            "data.task=regression",
            "evaluation.max_mae=45.5",
            "evaluation.baseline_tolerance=0.5",
        ]
    )
    rule = BlessingRule.from_config(config)
    assert (rule.metric.key, rule.bound, rule.worst_change) == ("mean_absolute_error", 45.5, 0.5)
    tfma_config = eval_config(config)
    (spec,) = tfma_config.model_specs
    assert spec.prediction_key == "predictions" and spec.label_key == "species_xf"
    names = [m.class_name for m in tfma_config.metrics_specs[0].metrics]
    assert {"MeanAbsoluteError", "RootMeanSquaredError"} <= set(names)
    assert "SparseCategoricalAccuracy" not in names
    mae = "mean_absolute_error"
    # The bar is an upper bound, applied as written.
    assert _verdict(tfma_config, mae, 45.5, None) == (True, [])
    assert _verdict(tfma_config, mae, 45.6, None) == (False, ["value"])
    # Against the baseline: a smaller error is better; worse by more than the tolerance fails.
    assert _verdict(tfma_config, mae, 30.0, 40.0) == (True, [])
    assert _verdict(tfma_config, mae, 40.4, 40.0) == (True, [])
    assert _verdict(tfma_config, mae, 41.0, 40.0) == (False, ["change"])
    reason = explain(rule, candidate=41.0, baseline=40.0, missed_bound=False, missed_baseline=True)
    assert "worse by 1.0000 (lower is better)" in reason, reason
    assert "evaluation.max_mae (at most 45.5)" in reason


def test_the_reason_names_both_values_and_the_rule_that_decided():
    rule = BlessingRule.from_config(load_config(overrides=["evaluation.baseline_tolerance=0.02"]))
    assert rule.bound == 0.8 and rule.worst_change == pytest.approx(-0.02)

    def reason(candidate, baseline, **missed):
        return explain(
            rule,
            candidate=candidate,
            baseline=baseline,
            missed_bound=missed.get("bound", False),
            missed_baseline=missed.get("baseline", False),
            baseline_is_candidate=missed.get("same", False),
        )

    assert reason(0.7, None, bound=True) == (
        f"its {ACCURACY} 0.7000 misses evaluation.accuracy_threshold (at least 0.8); no model of "
        "this pipeline was blessed before, so there was no baseline"
    )
    assert reason(0.89, 0.9).endswith(
        "the latest blessed model's is 0.9000: the new model is worse by 0.0100, within "
        "evaluation.baseline_tolerance (0.02)"
    )
    assert reason(0.95, 0.9).endswith(
        "the latest blessed model's is 0.9000: the new model is no worse"
    )
    assert reason(0.95, 0.95, same=True).endswith(
        "it is itself the latest blessed model of this pipeline"
    )
    off = BlessingRule.from_config(load_config(overrides=["evaluation.baseline=none"]))
    assert off.baseline_tolerance is None and off.worst_change is None
    assert "(evaluation.baseline: none)" in explain(
        off, candidate=0.9, baseline=None, missed_bound=False, missed_baseline=False
    )


def test_the_pipeline_resolves_the_latest_blessed_model_for_the_evaluator(tmp_path):
    config = load_config(overrides=[f"output_dir={tmp_path}"])

    def evaluator_inputs(**kwargs):
        pipeline = create_pipeline(
            config,
            input_base=str(tmp_path / "data"),
            pipeline_root=str(tmp_path / "root"),
            serving_dir=str(tmp_path / "serving"),
            **kwargs,
        )
        nodes = {node.id: node for node in pipeline.components}
        return nodes, nodes["Evaluator"].inputs

    nodes, inputs = evaluator_inputs()
    resolver = nodes[BASELINE_RESOLVER]
    strategy = resolver.exec_properties[RESOLVER_STRATEGY_CLASS]
    assert strategy is tfx.dsl.experimental.LatestBlessedModelStrategy
    assert inputs["baseline_model"].producer_component_id == BASELINE_RESOLVER
    # Where no resolver can run (Kubeflow's open-source backend), the Evaluator gets none.
    nodes, inputs = evaluator_inputs(resolve_baseline=False)
    assert BASELINE_RESOLVER not in nodes and "baseline_model" not in inputs
    off = dataclasses.replace(
        config, evaluation=dataclasses.replace(config.evaluation, baseline="none")
    )
    assert BASELINE_RESOLVER not in {
        node.id
        for node in create_pipeline(
            off,
            input_base=str(tmp_path / "data"),
            pipeline_root=str(tmp_path / "root"),
            serving_dir=str(tmp_path / "serving"),
        ).components
    }


# --- a worse run after a good one, on one output folder, while the good model is served -------
def _tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _predict(base: str, examples: list[bytes]) -> tuple[np.ndarray, str]:
    body = json.dumps(
        {"instances": [{"b64": base64.b64encode(e).decode()} for e in examples]}
    ).encode()
    request = urllib.request.Request(
        base + ":predict", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        payload = json.loads(response.read())
        version = response.headers["x-fullthrottle-model-version"]
    return np.array([p["probabilities"] for p in payload["predictions"]]), version


@pytest.fixture(scope="module")
def two_runs(penguins_run, tmp_path_factory):
    """The session's good run (300 steps), copied (metadata, artifacts, MLflow store, push folder:
    its cached components keep reading the original's artifacts), then a run trained for a
    single step on the copy, with the absolute bar at 0 so that only the comparison with the
    first model can refuse it, while `fullthrottle serve` serves the good model from the copy."""
    source, _ = penguins_run
    output_dir = tmp_path_factory.mktemp("validated") / "run"
    shutil.copytree(source, output_dir)
    first = last_run(source)
    served = _tree_digest(output_dir / "serving")
    examples = [strip_label(r, "species") for r in eval_split_examples(first, limit=16)]
    port = free_port()
    process = start_server(
        str(output_dir / "serving" / "penguins"), model_name="penguins", port=port,
        overrides=("serving.poll_seconds=0.2",),
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}/v1/models/penguins"
        before = _predict(base, examples)
        worse = run_cli(
            "run", "--output-dir", str(output_dir), "--set", "training.train_steps=1",
            "--set", "evaluation.accuracy_threshold=0",
        )  # fmt: skip
        after = _predict(base, examples)
    finally:
        server_output = stop_server(process)
    yield SimpleNamespace(
        output_dir=output_dir, first=first, served=served, worse=worse,
        before=before, after=after, server_output=server_output,
    )  # fmt: skip


@pytest.mark.slow
def test_the_first_model_is_blessed_on_the_bar_alone(two_runs):
    first = two_runs.first
    evaluation = first["evaluation"]
    assert evaluation["blessed"] is True and first["pushed_model_dir"]
    assert evaluation["baseline"] is None
    assert evaluation["primary_metric"] == ACCURACY and evaluation["higher_is_better"] is True
    assert evaluation["rule"]["evaluation.baseline"] == "latest_blessed"
    assert evaluation["candidate"]["metrics"][ACCURACY] == first["eval_metrics"][ACCURACY]
    assert "no model of this pipeline was blessed before" in evaluation["reason"]
    assert "meets evaluation.accuracy_threshold (at least 0.8)" in evaluation["reason"]


@pytest.mark.slow
def test_a_worse_model_is_not_pushed_and_says_why_with_both_metrics(two_runs):
    output_dir, first, worse = two_runs.output_dir, two_runs.first, two_runs.worse
    assert worse.returncode == 3, worse.stderr[-5000:]
    last = last_run(output_dir)
    assert last["status"] == "succeeded"
    assert last["blessed"] is False and last["pushed_model_dir"] is None
    evaluation = last["evaluation"]
    candidate, baseline = evaluation["candidate"], evaluation["baseline"]
    # The baseline is the first run's model, as pushed, measured again on the same eval split.
    assert baseline["model_uri"] == first["evaluation"]["candidate"]["model_uri"]
    assert baseline["pushed_version"] == first["pushed_version"]
    assert baseline["metrics"][ACCURACY] == pytest.approx(first["eval_metrics"][ACCURACY])
    assert candidate["model_uri"] != baseline["model_uri"]
    assert candidate["metrics"][ACCURACY] < baseline["metrics"][ACCURACY]
    # Refused by the comparison alone: the bar (0) was met.
    assert "meets evaluation.accuracy_threshold (at least 0)" in evaluation["reason"]
    assert "more than evaluation.baseline_tolerance (0) allows" in evaluation["reason"]
    # One paragraph on stderr with both models' accuracy, what is served and what to do.
    message = worse.stderr.strip().splitlines()[-1]
    assert message.startswith("fullthrottle run: the new model was not pushed")
    assert f"{candidate['metrics'][ACCURACY]:.4f}" in message
    assert f"{baseline['metrics'][ACCURACY]:.4f}" in message
    assert f"version {first['pushed_version']}" in message
    assert "evaluation.baseline_tolerance" in message and "Traceback" not in worse.stderr
    # The summary on stdout shows both models' metrics too.
    assert f"latest blessed model (pushed as version {first['pushed_version']})" in worse.stdout
    assert "not blessed: " in worse.stdout
    # Nothing pushed before stops being served: the push folder is exactly as it was.
    assert [p.name for p in served_dirs(output_dir / "serving" / "penguins")] == [
        first["pushed_version"]
    ]
    assert _tree_digest(output_dir / "serving") == two_runs.served


@pytest.mark.slow
# MLflow's own SQLAlchemy store, read directly here (third-party code we cannot change).
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")
def test_champion_stays_on_the_model_that_passed(two_runs):
    output_dir, first = two_runs.output_dir, two_runs.first
    client = MlflowClient(f"sqlite:///{output_dir / 'mlflow' / 'mlflow.db'}")
    versions = client.search_model_versions("name = 'penguins'")
    assert len(versions) == 1, [(v.version, v.tags) for v in versions]
    champion = client.get_model_version_by_alias("penguins", "champion")
    assert champion.version == versions[0].version
    assert champion.tags["push_version"] == first["pushed_version"]
    assert champion.tags["fullthrottle.blessing_reason"].startswith("blessed: ")
    # The refused run shows both models' metrics and why, on its MLflow run.
    run = client.get_run(last_run(output_dir)["tracking"]["run_id"])
    evaluation = last_run(output_dir)["evaluation"]
    assert run.data.metrics[f"evaluator/{ACCURACY}"] == pytest.approx(
        evaluation["candidate"]["metrics"][ACCURACY]
    )
    assert run.data.metrics[f"baseline/{ACCURACY}"] == pytest.approx(
        evaluation["baseline"]["metrics"][ACCURACY]
    )
    assert run.data.tags["fullthrottle.blessed"] == "false"
    assert run.data.tags["fullthrottle.blessing_reason"] == f"not blessed: {evaluation['reason']}"
    assert run.data.tags["fullthrottle.baseline_push_version"] == first["pushed_version"]


@pytest.mark.slow
def test_the_served_model_keeps_answering_through_a_refused_run(two_runs):
    (before, version), (after, version_after) = two_runs.before, two_runs.after
    assert version == two_runs.first["pushed_version"]
    # The server saw no new version: the same one answers the same probabilities.
    assert version_after == version
    np.testing.assert_array_equal(after, before)
    assert "Traceback" not in two_runs.server_output, two_runs.server_output[-3000:]
