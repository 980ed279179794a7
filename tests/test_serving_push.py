"""SafePusher and its pure push function: complete versions, warmup records, TFLite, refusals."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from serving.push import (
    STAGING_PREFIX,
    TFLITE_DYNAMIC_RANGE,
    TFLITE_FLOAT32,
    WARMUP_RELATIVE_PATH,
    PushError,
    push_model,
    version_dirs,
)
from tests.helpers import eval_split_examples, last_run, strip_label

pytestmark = pytest.mark.slow


def _pushed(penguins_run) -> tuple[dict, str]:
    output_dir, _ = penguins_run
    last = last_run(output_dir)
    return last, last["pushed_model_dir"]


def _examples(last: dict, limit: int = 32) -> list[bytes]:
    return [strip_label(r, "species") for r in eval_split_examples(last, limit=limit)]


def test_pipeline_push_has_warmup_records_the_model_answers(penguins_run):
    last, pushed_dir = _pushed(penguins_run)
    assert Path(pushed_dir).name.isdigit()
    serving_dir = Path(pushed_dir).parent
    assert not [p for p in os.listdir(serving_dir) if p.startswith(STAGING_PREFIX)], (
        "staging folder left behind"
    )
    records = [
        r.numpy() for r in tf.data.TFRecordDataset(os.path.join(pushed_dir, WARMUP_RELATIVE_PATH))
    ]
    assert len(records) == 64  # serving.warmup_requests default
    model = tf.saved_model.load(pushed_dir)
    seen = set()
    for record in records:
        request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
        assert request.model_spec.name == "penguins"
        seen.add(request.model_spec.signature_name)
        inputs = {
            name: tf.constant(tf.make_ndarray(proto)) for name, proto in request.inputs.items()
        }
        batch = next(iter(inputs.values())).shape[0]
        probabilities = model.signatures[request.model_spec.signature_name](**inputs)[
            "probabilities"
        ].numpy()
        assert probabilities.shape == (batch, 3)
        np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert seen == {"serving_default", "predict_raw"}


def test_push_refuses_to_overwrite_and_keeps_the_newest(penguins_run, tmp_path):
    last, pushed_dir = _pushed(penguins_run)
    serving_dir = tmp_path / "serving" / "penguins"
    first = push_model(
        model_dir=pushed_dir, serving_dir=str(serving_dir), model_name="penguins", version=100
    )
    marker = Path(first.version_dir) / "saved_model.pb"
    before = marker.read_bytes()
    with pytest.raises(PushError, match="already exists"):
        push_model(
            model_dir=pushed_dir, serving_dir=str(serving_dir), model_name="penguins", version=100
        )
    assert marker.read_bytes() == before
    # A later push never goes below the newest existing version, and retention keeps 2.
    pushes = [
        push_model(
            model_dir=pushed_dir,
            serving_dir=str(serving_dir),
            model_name="penguins",
            keep_versions=2,
        )
        for _ in range(2)
    ]
    assert pushes[0].version > 100 and pushes[1].version > pushes[0].version
    assert sorted(version_dirs(serving_dir)) == [pushes[0].version, pushes[1].version]
    assert pushes[1].removed_versions == (100,)
    assert sorted(os.listdir(serving_dir)) == sorted(str(p.version) for p in pushes), (
        "only version folders remain"
    )


def test_failed_push_publishes_nothing(penguins_run, tmp_path):
    last, pushed_dir = _pushed(penguins_run)
    serving_dir = tmp_path / "serving"
    with pytest.raises(PushError, match="saved_model.pb"):
        push_model(
            model_dir=str(tmp_path / "no_model"),
            serving_dir=str(serving_dir),
            model_name="penguins",
        )
    # A model that cannot answer its warmup requests is refused after staging: the copy is removed.
    broken = tmp_path / "broken"
    shutil.copytree(pushed_dir, broken)
    shutil.rmtree(broken / "variables")
    with pytest.raises((PushError, OSError, ValueError, tf.errors.OpError)):
        push_model(
            model_dir=str(broken),
            serving_dir=str(serving_dir),
            model_name="penguins",
            warmup_examples=_examples(last, 4),
            warmup_count=2,
        )
    assert os.listdir(serving_dir) == []


def test_unblessed_model_is_not_pushed(penguins_run, tmp_path):
    from tfx.types import standard_artifacts

    from components.safe_pusher import Executor

    _, pushed_dir = _pushed(penguins_run)
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "model")
    shutil.copytree(pushed_dir, tmp_path / "model" / "Format-Serving")
    blessing = standard_artifacts.ModelBlessing()
    blessing.set_int_custom_property("blessed", 0)
    pushed = standard_artifacts.PushedModel()
    pushed.uri = str(tmp_path / "pushed")
    serving_dir = tmp_path / "serving"
    properties = {
        "serving_dir": str(serving_dir),
        "model_name": "penguins",
        "label": "species",
        "push_config": '{"keep_versions": 0, "tflite": false, "tflite_quantize": false, "warmup_requests": 0}',
    }
    Executor().Do(
        {"model": [model], "model_blessing": [blessing]}, {"pushed_model": [pushed]}, properties
    )
    assert pushed.get_int_custom_property("pushed") == 0
    assert version_dirs(serving_dir) == {}
    blessing.set_int_custom_property("blessed", 1)
    Executor().Do(
        {"model": [model], "model_blessing": [blessing]}, {"pushed_model": [pushed]}, properties
    )
    assert pushed.get_int_custom_property("pushed") == 1
    assert (
        pushed.get_string_custom_property("pushed_destination")
        in version_dirs(serving_dir).values()
    )


# Stated tolerance: float32 TFLite vs the SavedModel differ only by kernel rounding (1e-4 on
# probabilities); dynamic-range quantization stores int8 weights, so up to 0.05, same class.
TFLITE_TOLERANCE = {TFLITE_FLOAT32: 1e-4, TFLITE_DYNAMIC_RANGE: 0.05}


# tf.lite.Interpreter warns that it moves to ai_edge_litert, which is not in the lock.
@pytest.mark.filterwarnings("ignore:(?s).*tf.lite.Interpreter is deprecated:UserWarning")
def test_tflite_matches_the_saved_model_on_eval_rows(penguins_run, tmp_path):
    last, pushed_dir = _pushed(penguins_run)
    result = push_model(
        model_dir=pushed_dir,
        serving_dir=str(tmp_path / "serving"),
        model_name="penguins",
        tflite=True,
        tflite_quantize=True,
    )
    labelled = eval_split_examples(last, limit=64)
    examples = [strip_label(r, "species") for r in labelled]
    model = tf.saved_model.load(result.version_dir)
    expected = model.signatures["serving_default"](examples=tf.constant(examples))[
        "probabilities"
    ].numpy()
    # transform_features parses the full raw spec (the Evaluator's use), so it needs the label.
    transformed = model.signatures["transform_features"](examples=tf.constant(labelled))
    assert sorted(os.path.basename(p) for p in result.tflite_files) == sorted(TFLITE_TOLERANCE)
    # With and without the default delegates (XNNPACK): without them, an unfrozen variable shows
    # up as a failing READ_VARIABLE op instead of being hidden by the delegate.
    resolvers = (
        tf.lite.experimental.OpResolverType.AUTO,
        tf.lite.experimental.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    for path in result.tflite_files:
        for resolver in resolvers:
            interpreter = tf.lite.Interpreter(
                model_path=path, experimental_op_resolver_type=resolver
            )
            runner = interpreter.get_signature_runner("predict_transformed")
            names = interpreter.get_signature_list()["predict_transformed"]["inputs"]
            got = runner(**{name: transformed[name].numpy() for name in names})["probabilities"]
            tolerance = TFLITE_TOLERANCE[os.path.basename(path)]
            np.testing.assert_allclose(got, expected, atol=tolerance, err_msg=f"{path} {resolver}")
            assert (got.argmax(axis=1) == expected.argmax(axis=1)).all()
