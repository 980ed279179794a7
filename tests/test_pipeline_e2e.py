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
    output_dir, _ = penguins_run
    last = last_run(output_dir)
    model = tf.saved_model.load(last["pushed_model_dir"])
    raw_signature = model.signatures["predict_raw"]
    specs = raw_signature.structured_input_signature[1]
    assert "species" not in specs and set(specs) >= {"island", "bill_length_mm", "sex"}
    # Dense raw tensors cannot say "missing": compare on rows where every feature is present.
    rows = []
    for record in eval_split_examples(last):
        features = tf.train.Example.FromString(record).features.feature
        values = {name: _feature_value(features[name]) for name in specs}
        if all(v is not None for v in values.values()):
            rows.append((record, values))
    assert len(rows) >= 20
    inputs = {
        name: tf.constant([values[name] for _, values in rows], dtype=spec.dtype)
        for name, spec in specs.items()
    }
    raw_probabilities = raw_signature(**inputs)["probabilities"].numpy()
    examples = tf.constant([strip_label(record, "species") for record, _ in rows])
    example_probabilities = model.signatures["serving_default"](examples=examples)[
        "probabilities"
    ].numpy()
    np.testing.assert_allclose(raw_probabilities, example_probabilities, atol=1e-5)


def test_a_default_run_leaves_nothing_in_the_temp_folder(penguins_run):
    _, result = penguins_run
    assert leftovers(Path(result.tmpdir)) == []
    # in_memory is DirectRunner's default: no Beam argument, so TFX does not package itself.
    assert beam_pipeline_args(BeamConfig()) == []
