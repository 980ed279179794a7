"""The Transformer path end to end on the bundled text data, and the bundled data itself."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fullthrottle.core import bundled
from tests.helpers import REPO, eval_split_examples, label_of, last_run, run_cli, strip_label


def test_bundled_text_dataset_is_what_the_generator_makes():
    shipped = bundled.text_topics_path().read_text(encoding="utf-8")
    assert shipped == bundled.generate_text_topics(), (
        "regenerate with: python -m fullthrottle.core.bundled"
    )
    assert any("\u4e00" <= ch <= "\u9fff" for ch in shipped), "the dataset must exercise CJK text"


@pytest.mark.slow
def test_text_model_trains_through_the_pipeline_and_answers_raw_strings(tmp_path):
    result = run_cli(
        "run", "--config", str(REPO / "configs" / "text_topics.yaml"), "--output-dir", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr[-4000:]
    last = last_run(tmp_path)
    assert last["training"]["model_kind"] == "transformer"
    assert last["blessed"] and last["pushed_model_dir"]
    model = tf.saved_model.load(last["pushed_model_dir"])

    # Held-out rows through serving_default (serialized tf.Example with the raw text inside).
    records = eval_split_examples(last)
    labels = [label_of(r, "topic") for r in records]
    outputs = model.signatures["serving_default"](
        examples=tf.constant([strip_label(r, "topic") for r in records])
    )
    np.testing.assert_allclose(outputs["probabilities"].numpy().sum(axis=1), 1.0, atol=1e-5)
    accuracy = np.mean(
        [c.decode() == y for c, y in zip(outputs["classes"].numpy(), labels, strict=True)]
    )
    assert accuracy > 0.7, accuracy

    # Raw strings (English and Chinese) through the raw-feature signature.
    raw = model.signatures["predict_raw"]
    specs = raw.structured_input_signature[1]
    assert specs["length_hint"].dtype == tf.float32
    messages = [
        "the team won the match with a late goal",
        "今天的面条非常好吃",
        "my laptop battery update",
    ]
    inputs = {
        "message": tf.constant(messages),
        "language": tf.constant(["en", "zh", "en"]),
        # A numeric column is a number (float32) although the CSV holds whole numbers only.
        "length_hint": tf.constant([float(len(m)) for m in messages]),
    }
    answer = raw(**inputs)
    probabilities = answer["probabilities"].numpy()
    assert probabilities.shape == (3, 4)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert set(c.decode() for c in answer["classes"].numpy()) <= {
        "sports",
        "tech",
        "food",
        "travel",
    }
