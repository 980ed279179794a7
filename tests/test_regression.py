"""Regression as a task, from the user's side: scikit-learn's diabetes data (a numeric target,
442 rows, 214 distinct values; shipped inside the package, written to a CSV here) -> `init` ->
`run` -> a pushed model whose numbers every way of asking agrees on.

One real pipeline run for the module: `init` must write `data.task: regression` with its reason
and the median's error as `evaluation.max_mae`; the run must push, with MAE and RMSE in the
summary, last_run.json and MLflow; the pushed SavedModel's `regression` signature (TF Serving's
regress method), `serving_default`, `predict_raw`, the MLflow pyfunc model, `fullthrottle serve`
over REST `:regress` and gRPC `Regress` (the official tensorflow-serving-api stubs) and
`fullthrottle predict` must answer the same numbers, and those numbers must reproduce the
Evaluator's MAE on the eval split.
"""

from __future__ import annotations

import base64
import json
import math
import shutil
import statistics
import urllib.request
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import grpc
import mlflow
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
import yaml
from mlflow.tracking import MlflowClient
from sklearn.datasets import load_diabetes
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc, regression_pb2

from fullthrottle.bench.serving import free_port, start_server, stop_server
from fullthrottle.core.config import load_config
from fullthrottle.tracking.store import scoped_tracking_uri
from serving.push import export_tflite
from serving.signatures import (
    REGRESS_METHOD,
    call_signature,
    raw_inputs_from_examples,
    signature_input_specs,
)
from tests.helpers import eval_split_examples, last_run, run_cli, strip_label

pytestmark = pytest.mark.slow

LABEL = "target"
TRAIN_STEPS = 300


@pytest.fixture(scope="module")
def diabetes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("diabetes")
    frame = load_diabetes(as_frame=True).frame
    csv_path = folder / "diabetes.csv"
    frame.to_csv(csv_path, index=False)
    config_path = folder / "diabetes.yaml"
    init = run_cli(
        "init", "--data", str(csv_path), "--label", LABEL, "--output", str(config_path)
    )  # fmt: skip
    assert init.returncode == 0, init.stdout + init.stderr
    output_dir = folder / "out"
    run = run_cli(
        "run", "--config", str(config_path), "--output-dir", str(output_dir),
        "--set", f"training.train_steps={TRAIN_STEPS}",
    )  # fmt: skip
    return SimpleNamespace(
        frame=frame,
        csv_path=csv_path,
        config_path=config_path,
        init=init,
        run=run,
        output_dir=output_dir,
    )


@pytest.fixture(scope="module")
def pushed(diabetes):
    assert diabetes.run.returncode == 0, (
        f"run failed:\n{diabetes.run.stdout}\n{diabetes.run.stderr[-5000:]}"
    )
    last = last_run(diabetes.output_dir)
    examples = [strip_label(e, LABEL) for e in eval_split_examples(last)]
    labels = np.array(
        [
            tf.train.Example.FromString(e).features.feature[LABEL].float_list.value[0]
            for e in eval_split_examples(last)
        ]
    )
    model = tf.saved_model.load(last["pushed_model_dir"])
    served = model.signatures["serving_default"](examples=tf.constant(examples))
    return SimpleNamespace(
        last=last,
        model=model,
        examples=examples,
        labels=labels,
        predictions=served["predictions"].numpy(),
    )


def test_init_writes_a_regression_config_with_the_reason_and_the_medians_error(diabetes):
    text = diabetes.config_path.read_text(encoding="utf-8")
    config = load_config(diabetes.config_path)
    assert config.data.task == "regression"
    assert config.data.label == LABEL
    assert set(config.data.numeric) == set(diabetes.frame.columns) - {LABEL}
    # The reason is written beside the decision, and init's table says it too.
    (task_line,) = [line for line in text.splitlines() if line.strip().startswith("task:")]
    assert "214 distinct numbers in 442 labelled rows" in task_line, task_line
    assert "a number to predict: 25 .. 346" in diabetes.init.stdout
    # The bar: the error of always answering the median, rounded down (never up) to 4 digits.
    target = diabetes.frame[LABEL].to_numpy()
    median_error = float(np.mean(np.abs(target - statistics.median(target))))
    written = Fraction(str(config.evaluation.max_mae))
    assert written <= Fraction(median_error) < written + Fraction(1, 10), (written, median_error)


# MLflow's SQLAlchemy store, read here, uses a loader strategy SQLAlchemy deprecates (MLflow's).
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")
def test_the_run_pushes_and_reports_mae_and_rmse_everywhere(diabetes, pushed):
    last = pushed.last
    assert last["blessed"] is True and last["pushed_model_dir"], last
    metrics = last["eval_metrics"]
    mae, rmse = metrics["mean_absolute_error"], metrics["root_mean_squared_error"]
    assert 0 < mae <= rmse and math.isfinite(rmse)
    bar = load_config(diabetes.config_path).evaluation.max_mae
    assert mae <= bar
    assert last["evaluation"]["primary_metric"] == "mean_absolute_error"
    assert last["evaluation"]["higher_is_better"] is False
    assert "evaluation.max_mae (at most" in last["evaluation"]["reason"]
    # The Trainer's own eval pass: MAE and RMSE instead of accuracy.
    trainer_eval = last["training"]["eval_metrics"]
    assert {"mae", "rmse"} <= set(trainer_eval) and "accuracy" not in trainer_eval
    assert last["training"]["steps_completed"] == TRAIN_STEPS
    stdout = diabetes.run.stdout
    assert "mean_absolute_error=" in stdout and "root_mean_squared_error=" in stdout
    assert "eval MAE" in stdout + diabetes.run.stderr
    # MLflow: the pipeline run has both the Evaluator's and the Trainer's errors, and the pushed
    # model was logged (tracking complete).
    tracking = last["tracking"]
    assert tracking["complete"] is True, tracking
    logged = MlflowClient(tracking["uri"]).get_run(tracking["run_id"]).data.metrics
    assert logged["evaluator/mean_absolute_error"] == pytest.approx(mae, rel=1e-6)
    assert logged["evaluator/root_mean_squared_error"] == pytest.approx(rmse, rel=1e-6)
    assert {"eval/mae", "eval/rmse"} <= set(logged)
    # `compare` shows the errors as rows of their own.
    compared = run_cli(
        "compare", "--config", str(diabetes.config_path), "--output-dir",
        str(diabetes.output_dir), "--last", "1",
        "--chart", str(diabetes.output_dir / "compare.png"),
    )  # fmt: skip
    assert compared.returncode == 0, compared.stdout + compared.stderr
    rows = {line.split()[0]: line.split()[1:] for line in compared.stdout.splitlines() if line}
    assert rows["MAE"] == [f"{mae:.4g}"] and rows["RMSE"] == [f"{rmse:.4g}"], compared.stdout


@pytest.mark.filterwarnings("ignore:(?s).*tf.lite.Interpreter is deprecated:UserWarning")
def test_the_pushed_models_signatures_answer_the_same_numbers(pushed, tmp_path):
    model, examples = pushed.model, pushed.examples
    assert pushed.predictions.shape == (len(examples),)
    # The served numbers reproduce the Evaluator's MAE on the same eval split.
    mae = float(np.mean(np.abs(pushed.predictions - pushed.labels)))
    assert mae == pytest.approx(pushed.last["eval_metrics"]["mean_absolute_error"], rel=1e-4)
    # TF Serving's regression signature: method tensorflow/serving/regress, `inputs` -> `outputs`.
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((Path(pushed.last["pushed_model_dir"]) / "saved_model.pb").read_bytes())
    signature = saved.meta_graphs[0].signature_def["regression"]
    assert signature.method_name == REGRESS_METHOD
    assert list(signature.inputs) == ["inputs"] and list(signature.outputs) == ["outputs"]
    assert "classification" not in saved.meta_graphs[0].signature_def
    regressed = model.signatures["regression"](inputs=tf.constant(examples))["outputs"].numpy()
    np.testing.assert_allclose(regressed, pushed.predictions, rtol=1e-6)
    # predict_raw: one tensor per raw column.
    specs = signature_input_specs(model, "predict_raw")
    raw = call_signature(model, "predict_raw", raw_inputs_from_examples(examples, specs))
    np.testing.assert_allclose(raw["predictions"].numpy(), pushed.predictions, rtol=1e-5)
    # The TFLite export of the model without Transform agrees (within its tolerance, relative
    # to the numbers' size).
    written = export_tflite(pushed.last["pushed_model_dir"], str(tmp_path), quantize=False)
    assert [Path(p).name for p in written] == ["model_float32.tflite"]
    # The MLflow model: numbers out.
    model_id = pushed.last["tracking"]["model_id"]
    with scoped_tracking_uri(pushed.last["tracking"]["uri"]):
        pyfunc = mlflow.pyfunc.load_model(f"models:/{model_id}")
    answered = pyfunc.predict(pd.DataFrame(raw_inputs_from_examples(examples, specs)))
    assert list(answered.columns) == ["prediction"]
    np.testing.assert_allclose(answered["prediction"].to_numpy(), pushed.predictions, rtol=1e-5)


def _json_row(example: bytes) -> dict:
    features = tf.train.Example.FromString(example).features.feature
    return {name: float(feature.float_list.value[0]) for name, feature in features.items()}


def test_serve_answers_regress_over_rest_and_grpc_and_predict_prints_numbers(diabetes, pushed):
    examples = pushed.examples[:16]
    expected = pushed.predictions[:16]
    config_file = diabetes.output_dir.parent / "serve.yaml"
    config_file.write_text(yaml.safe_dump({"tracking": {"enabled": False}}))
    port, grpc_port = free_port(), free_port()
    serving_dir = str(Path(pushed.last["pushed_model_dir"]).parent)
    model_name = pushed.last["model_name"]
    process = start_server(
        serving_dir, model_name=model_name, port=port, grpc_port=grpc_port,
        config_file=str(config_file),
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}/v1/models/{model_name}"
        body = {"signature_name": "regression", "examples": [_json_row(e) for e in examples]}
        request = urllib.request.Request(
            base + ":regress", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            results = json.loads(response.read())["results"]
        np.testing.assert_allclose(results, expected, rtol=1e-5)

        regress = regression_pb2.RegressionRequest()
        regress.model_spec.name = model_name
        regress.model_spec.signature_name = "regression"
        for example in examples:
            regress.input.example_list.examples.add().CopyFrom(tf.train.Example.FromString(example))
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            answer = stub.Regress(regress, timeout=60)
        np.testing.assert_allclose(
            [r.value for r in answer.result.regressions], expected, rtol=1e-5
        )

        # `fullthrottle predict` on CSV rows: one number per line, the SavedModel's numbers.
        rows = diabetes.output_dir.parent / "rows.csv"
        header = sorted(_json_row(examples[0]))
        lines = [",".join(header)]
        lines += [",".join(repr(_json_row(e)[name]) for name in header) for e in examples]
        rows.write_text("\n".join(lines) + "\n", encoding="utf-8")
        predicted = run_cli(
            "predict", "--config", str(diabetes.config_path), "--csv", str(rows),
            "--url", f"http://127.0.0.1:{port}",
        )  # fmt: skip
        assert predicted.returncode == 0, predicted.stdout + predicted.stderr
        printed = [float(line) for line in predicted.stdout.split()]
        np.testing.assert_allclose(printed, expected, rtol=1e-5)
        # The same rows base64-encoded through REST :predict on serving_default.
        instances = [{"b64": base64.b64encode(e).decode()} for e in examples]
        request = urllib.request.Request(
            base + ":predict",
            data=json.dumps({"signature_name": "serving_default", "instances": instances}).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            predictions = json.loads(response.read())["predictions"]
        np.testing.assert_allclose(predictions, expected, rtol=1e-5)
    finally:
        output = stop_server(process)
    assert "Traceback" not in output, output[-3000:]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_worse_regression_model_is_not_pushed_and_says_why_with_both_errors(
    diabetes, pushed, tmp_path
):
    """A second run on a copy of the module's run (its cached components keep reading the
    original's artifacts), trained for one step with a bar it cannot miss: only the comparison
    with the first model, where a lower MAE is better, can refuse it."""
    output_dir = tmp_path / "run"
    shutil.copytree(diabetes.output_dir, output_dir)
    serving = output_dir / Path(pushed.last["pushed_model_dir"]).parent.relative_to(
        diabetes.output_dir
    )
    served = _files(serving)
    worse = run_cli(
        "run", "--config", str(diabetes.config_path), "--output-dir", str(output_dir),
        "--set", "training.train_steps=1", "--set", "evaluation.max_mae=100000",
    )  # fmt: skip
    assert worse.returncode == 3, worse.stdout + worse.stderr[-5000:]
    last = last_run(output_dir)
    assert last["blessed"] is False and last["pushed_model_dir"] is None
    evaluation = last["evaluation"]
    candidate = evaluation["candidate"]["metrics"]["mean_absolute_error"]
    baseline = evaluation["baseline"]["metrics"]["mean_absolute_error"]
    # The baseline is the first run's pushed model, measured again on the same eval rows.
    assert baseline == pytest.approx(pushed.last["eval_metrics"]["mean_absolute_error"], rel=1e-5)
    assert evaluation["baseline"]["pushed_version"] == pushed.last["pushed_version"]
    assert candidate > baseline
    assert "(lower is better)" in evaluation["reason"]
    assert "meets evaluation.max_mae (at most 100000" in evaluation["reason"]
    message = worse.stderr.strip().splitlines()[-1]
    assert message.startswith("fullthrottle run: the new model was not pushed"), message
    assert f"{candidate:.4f}" in message and f"{baseline:.4f}" in message
    assert "Traceback" not in worse.stderr
    # What was served stays served, byte for byte.
    assert _files(serving) == served
