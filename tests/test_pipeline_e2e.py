"""The whole pipeline, end to end, on the bundled data: real TFX components on real Beam."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from fullthrottle.core.config import BeamConfig
from pipelines.local_runner import beam_pipeline_args
from tests.helpers import (
    assert_all_components_completed,
    eval_split_examples,
    label_of,
    last_run,
    leftovers,
    strip_label,
)

pytestmark = pytest.mark.slow


def test_every_component_ran_and_a_model_was_pushed(penguins_run):
    output_dir, result = penguins_run
    last = last_run(output_dir)
    assert last["status"] == "succeeded"
    assert_all_components_completed(last)
    assert last["blessed"] is True
    pushed = Path(last["pushed_model_dir"])
    assert pushed.parent == output_dir / "serving" / "penguins"
    assert pushed.name.isdigit(), "TF Serving needs an integer version folder"
    assert (pushed / "saved_model.pb").exists()
    for key in ("pipeline_root", "mlmd_path", "started_at", "finished_at", "eval_metrics"):
        assert last[key], key
    assert Path(last["mlmd_path"]).exists()
    assert last["eval_metrics"]["sparse_categorical_accuracy"] > 0.9
    assert "pushed:" in result.stdout


def test_pushed_model_answers_held_out_examples(penguins_run):
    output_dir, _ = penguins_run
    last = last_run(output_dir)
    model = tf.saved_model.load(last["pushed_model_dir"])
    serve = model.signatures["serving_default"]
    records = eval_split_examples(last)
    assert len(records) >= 40
    labels = [label_of(r, "species") for r in records]
    outputs = serve(examples=tf.constant([strip_label(r, "species") for r in records]))
    probabilities = outputs["probabilities"].numpy()
    assert probabilities.dtype == np.float32
    assert probabilities.shape == (len(records), 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    predicted = [c.decode() for c in outputs["classes"].numpy()]
    accuracy = np.mean([p == y for p, y in zip(predicted, labels, strict=True)])
    assert accuracy > 0.9, accuracy


def _feature_value(feature: tf.train.Feature):
    for kind in ("float_list", "int64_list", "bytes_list"):
        values = getattr(feature, kind).value
        if values:
            return values[0]
    return None


def test_raw_feature_signature_matches_example_signature(penguins_run):
    """predict_raw and serving_default agree on every held-out row, missing cells included:
    predict_raw takes a missing number as NaN and a missing text as "", the tf.Example leaves
    it out (as CsvExampleGen does); both read it as the CSV's empty cell."""
    from serving.signatures import raw_inputs_from_examples

    output_dir, _ = penguins_run
    last = last_run(output_dir)
    model = tf.saved_model.load(last["pushed_model_dir"])
    raw_signature = model.signatures["predict_raw"]
    specs = raw_signature.structured_input_signature[1]
    assert "species" not in specs and set(specs) >= {"island", "bill_length_mm", "sex"}
    # A measurement is a number whatever the sample held: float32, whole or not.
    for name in ("bill_length_mm", "flipper_length_mm", "body_mass_g"):
        assert specs[name].dtype == tf.float32, name
    records = [strip_label(record, "species") for record in eval_split_examples(last)]
    held_out = len(records)
    # The held-out rows, and the same rows with cells taken out (as empty CSV cells are).
    for index, record in enumerate(list(records[:12])):
        example = tf.train.Example.FromString(record)
        for name in (("sex", "bill_length_mm"), ("body_mass_g",), ("flipper_length_mm", "sex"))[
            index % 3
        ]:
            del example.features.feature[name]
        records.append(example.SerializeToString())
    inputs = raw_inputs_from_examples(records, specs)
    raw_probabilities = raw_signature(**{k: tf.constant(v) for k, v in inputs.items()})[
        "probabilities"
    ].numpy()
    example_probabilities = model.signatures["serving_default"](examples=tf.constant(records))[
        "probabilities"
    ].numpy()
    np.testing.assert_allclose(raw_probabilities, example_probabilities, atol=1e-5)
    # Taking cells out changed answers (imputed values are not the row's own).
    assert not np.allclose(raw_probabilities[held_out:], raw_probabilities[:12], atol=1e-4)


def test_the_logged_model_carries_the_evaluators_metrics_and_params(penguins_run):
    """MLflow 3's model page: the Evaluator's metrics logged with the model's id (on the eval
    dataset), and the run's params, on the logged model itself."""
    from mlflow.tracking import MlflowClient

    output_dir, _ = penguins_run
    last = last_run(output_dir)
    client = MlflowClient(f"sqlite:///{output_dir / 'mlflow' / 'mlflow.db'}")
    model_id = last["tracking"]["model_id"]
    logged = client.get_logged_model(model_id)
    metrics = {m.key: m for m in logged.metrics or []}
    for name, value in last["eval_metrics"].items():
        metric = metrics[f"evaluator/{name}"]
        assert metric.value == pytest.approx(value), name
        assert metric.model_id == model_id and metric.dataset_name == "eval", metric
    run = client.get_run(last["tracking"]["run_id"])
    (eval_dataset,) = [d.dataset for d in run.inputs.dataset_inputs if d.dataset.name == "eval"]
    assert metrics["evaluator/sparse_categorical_accuracy"].dataset_digest == eval_dataset.digest
    assert logged.params["training.train_steps"] == "300"
    assert logged.params["data.label"] == "species"
    assert {k: v for k, v in run.data.params.items() if not k.startswith("derived.")} == (
        logged.params
    )


def test_a_default_run_leaves_nothing_in_the_temp_folder(penguins_run):
    _, result = penguins_run
    assert leftovers(Path(result.tmpdir)) == []
    # in_memory is DirectRunner's default: no Beam argument, so TFX does not package itself.
    assert beam_pipeline_args(BeamConfig()) == []
