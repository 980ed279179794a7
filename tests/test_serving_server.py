"""`fullthrottle serve` (KServe model server, TF Serving REST and gRPC APIs) and `fullthrottle predict`.

One server process on random 127.0.0.1 ports serves a copy of the pipeline's push folder, with
the label `champion` read from a copy of the run's MLflow registry (the pipeline moved that
alias to the pushed version); the hot-swap test comes last because it pushes a new version into
that folder. `tests/test_serving_tf_serving_api.py` checks the API case by case on a small model.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from fullthrottle.bench.serving import free_port, start_server, stop_server
from serving.push import push_model, version_dirs
from serving.servables import is_complete
from tests.helpers import eval_split_examples, last_run, run_cli, strip_label

pytestmark = pytest.mark.slow

GRPC_LIMIT = 1_000_000
# A penguin whose measurements are all whole numbers.
WHOLE_PENGUIN = {
    "island": "Biscoe", "bill_length_mm": 47.0, "bill_depth_mm": 15.0,
    "flipper_length_mm": 215.0, "body_mass_g": 5000.0, "sex": "female",
}  # fmt: skip
NUMERIC = ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g")


def _post(url: str, body: bytes | dict, *, headers: dict | None = None) -> tuple[int, dict, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers=headers or {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), dict(exc.headers)


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.fixture(scope="module")
def served(penguins_run, tmp_path_factory):
    output_dir, _ = penguins_run
    last = last_run(output_dir)
    work = tmp_path_factory.mktemp("served")
    serving_dir = work / "penguins"
    shutil.copytree(Path(last["pushed_model_dir"]).parent, serving_dir)
    # The run's registry, copied: its `champion` alias names the pushed version.
    shutil.copy(output_dir / "mlflow" / "mlflow.db", work / "mlflow.db")
    port, grpc_port = free_port(), free_port()
    # A small request limit so the over-size case needs no megabytes; 0.2 s polling for the swap.
    process = start_server(
        str(serving_dir),
        model_name="penguins",
        port=port,
        grpc_port=grpc_port,
        overrides=(
            "serving.max_request_bytes=200000",
            # A gRPC limit of its own (TF Serving's default, 2 GiB, is checked on the contract
            # model): a larger request gets RESOURCE_EXHAUSTED.
            f"serving.grpc_max_message_bytes={GRPC_LIMIT}",
            "serving.poll_seconds=0.2",
            f"tracking.uri=sqlite:///{work / 'mlflow.db'}",
        ),
    )
    yield {
        "base": f"http://127.0.0.1:{port}/v1/models/penguins",
        "dir": serving_dir,
        "last": last,
        "port": port,
        "grpc": f"127.0.0.1:{grpc_port}",
    }
    output = stop_server(process)
    assert "Traceback" not in output, output[-3000:]


def _rows(last: dict, limit: int = 24) -> tuple[list[bytes], dict[str, np.ndarray]]:
    from serving.signatures import raw_inputs_from_examples

    examples = [strip_label(r, "species") for r in eval_split_examples(last, limit=limit)]
    model = tf.saved_model.load(last["pushed_model_dir"])
    specs = dict(model.signatures["predict_raw"].structured_input_signature[1])
    raw = raw_inputs_from_examples(examples, specs)
    return examples, raw


def _json_value(value):
    """A raw feature value for a JSON body; a missing float stays NaN (TF Serving takes NaN)."""
    if isinstance(value, bytes):
        return value.decode()
    return value.item() if hasattr(value, "item") else value


def test_rest_answers_like_the_saved_model_in_both_formats(served):
    examples, raw = _rows(served["last"])
    model = tf.saved_model.load(served["last"]["pushed_model_dir"])
    expected = model.signatures["serving_default"](examples=tf.constant(examples))[
        "probabilities"
    ].numpy()
    expected_raw = model.signatures["predict_raw"](**{k: tf.constant(v) for k, v in raw.items()})
    expected_raw_p = expected_raw["probabilities"].numpy()
    url = served["base"] + ":predict"

    status, body, headers = _post(
        url, {"instances": [{"b64": base64.b64encode(e).decode()} for e in examples]}
    )
    assert status == 200, body
    np.testing.assert_allclose(
        [p["probabilities"] for p in body["predictions"]], expected, atol=1e-6
    )
    assert int(headers["x-fullthrottle-model-version"]) == max(version_dirs(served["dir"]))

    instances = [{k: _json_value(v[i]) for k, v in raw.items()} for i in range(len(examples))]
    status, body, _ = _post(url, {"signature_name": "predict_raw", "instances": instances})
    assert status == 200, body
    np.testing.assert_allclose(
        [p["probabilities"] for p in body["predictions"]], expected_raw_p, atol=1e-6
    )
    assert [p["classes"] for p in body["predictions"]] == [
        c.decode() for c in expected_raw["classes"].numpy()
    ]

    columns = {k: [_json_value(x) for x in v] for k, v in raw.items()}
    status, body, _ = _post(url, {"signature_name": "predict_raw", "inputs": columns})
    assert status == 200, body
    np.testing.assert_allclose(body["outputs"]["probabilities"], expected_raw_p, atol=1e-6)


def _one_raw_instance(served) -> dict:
    _, raw = _rows(served["last"], limit=1)
    return {k: _json_value(v[0]) for k, v in raw.items()}


MALFORMED = {
    "missing key": (
        lambda i: {"signature_name": "predict_raw"},
        400,
        "Missing 'inputs' or 'instances' key",
    ),
    "both keys": (lambda i: {"instances": [i], "inputs": {}}, 400, "only one of"),
    "wrong type": (
        lambda i: {"signature_name": "predict_raw", "instances": [{**i, "bill_length_mm": "long"}]},
        400,
        "key: bill_length_mm of 'instances' list. Error: INVALID_ARGUMENT: JSON Value: \"long\" "
        "Type: String is not of expected type: float",
    ),
    "wrong shape": (
        lambda i: {
            "signature_name": "predict_raw",
            "instances": [{**i, "island": ["Biscoe", "Dream"]}],
        },
        400,
        "shape",
    ),
    "unknown feature": (
        lambda i: {"signature_name": "predict_raw", "instances": [{**i, "wings": 2}]},
        400,
        "does not have named input: wings",
    ),
    "missing feature": (
        lambda i: {
            "signature_name": "predict_raw",
            "instances": [{k: v for k, v in i.items() if k != "sex"}],
        },
        400,
        "keys must be equal to",
    ),
    "a required feature sent empty": (
        lambda i: {"signature_name": "predict_raw", "instances": [{**i, "island": ""}]},
        400,
        "Feature: island (data type: string) is required but could not be found.",
    ),
    "a number sent as text in a tf.Example": (
        lambda i: {
            "signature_name": "classification",
            "examples": [{**i, "body_mass_g": "heavy"}],
        },
        400,
        "Key: body_mass_g. Data types do not match. Data type: string but expected type: float",
    ),
    "empty instances": (lambda i: {"instances": []}, 400, "No values in 'instances' array"),
    "unknown signature": (
        lambda i: {"signature_name": "nope", "instances": [i]},
        400,
        'Serving signature name: "nope" not found in signature def',
    ),
    "non-JSON body": (lambda i: b"{not json", 400, "JSON Parse error"),
    "body over the size limit": (
        lambda i: b'{"instances": ["' + b"a" * 300_000 + b'"]}',
        413,
        "limit",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_request_gets_4xx_json_and_the_server_keeps_serving(served, case):
    make, status_expected, message = MALFORMED[case]
    instance = _one_raw_instance(served)
    body = make(instance)
    method = ":classify" if isinstance(body, dict) and "examples" in body else ":predict"
    status, reply, _ = _post(served["base"] + method, body)
    assert status == status_expected, reply
    assert set(reply) == {"error"} and message.lower() in reply["error"].lower(), reply
    status, reply, _ = _post(
        served["base"] + ":predict", {"signature_name": "predict_raw", "instances": [instance]}
    )
    assert status == 200 and len(reply["predictions"]) == 1, reply


def test_unknown_model_or_version_is_404_and_status_is_tf_serving_shaped(served):
    root = served["base"].rsplit("/", 1)[0]
    version = max(version_dirs(served["dir"]))
    instance = _one_raw_instance(served)
    body = {"signature_name": "predict_raw", "instances": [instance]}
    assert _post(f"{root}/other:predict", body)[0] == 404
    assert _post(f"{served['base']}/versions/1:predict", body)[0] == 404
    assert _post(f"{served['base']}/versions/..:predict", body)[0] in (400, 404)
    status, reply, headers = _post(f"{served['base']}/versions/{version}:predict", body)
    assert status == 200 and int(headers["x-fullthrottle-model-version"]) == version
    status, reply = _get(served["base"])
    assert status == 200
    assert reply["model_version_status"][0] == {
        "version": str(version),
        "state": "AVAILABLE",
        "status": {"error_code": "OK", "error_message": ""},
    }
    assert _get(f"{root}/other")[0] == 404


def test_predict_command_sends_csv_rows(served, tmp_path):
    csv_file = tmp_path / "rows.csv"
    csv_file.write_text(
        "species,island,bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g,sex,year\n"
        "Adelie,Torgersen,39.1,18.7,181,3750,male,2007\n"
        "Gentoo,Biscoe,50.0,15.2,218,5700,NA,2008\n"
    )
    url = served["base"].split("/v1/")[0]
    result = run_cli("predict", "--csv", str(csv_file), "--url", url, "--output", "json")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(result.stdout)
    assert [r["classes"] for r in rows] == ["Adelie", "Gentoo"]
    _assert_text_names_each_probability(["--csv", str(csv_file), "--url", url], rows)
    bad = run_cli("predict", "--csv", str(csv_file), "--url", url, "--version", "7")
    assert bad.returncode == 2 and "404" in bad.stderr and "Traceback" not in bad.stderr
    # A missing cell of a feature the model requires (island): the server refuses the batch, the
    # client names the CSV line and column.
    csv_file.write_text(
        "island,bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g,sex,year\n"
        "Torgersen,39.1,18.7,181,3750,male,2007\n"
        "NA,50.0,15.2,218,5700,female,2008\n"
    )
    refused = run_cli("predict", "--csv", str(csv_file), "--url", url)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "column 'island' is empty or missing on line(s) 3:" in refused.stderr.replace(
        "\n", " "
    ), refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr


def _assert_text_names_each_probability(arguments: list[str], rows: list[dict]) -> None:
    """`predict`'s text output (run in this process): per row the class, then every class name
    with its probability, as the JSON output has them."""
    from fullthrottle.cli import build_parser
    from fullthrottle.commands import predict

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert predict.run(build_parser().parse_args(["predict", *arguments])) == 0
    lines = buffer.getvalue().splitlines()
    assert len(lines) == len(rows)
    for line, row in zip(lines, rows, strict=True):
        predicted, scores = line.split("\t")
        named = dict(pair.split("=") for pair in scores.split(" "))
        assert predicted == row["classes"] and sorted(named) == ["Adelie", "Chinstrap", "Gentoo"]
        assert max(named, key=lambda name: float(named[name])) == predicted
        assert sorted(float(p) for p in named.values()) == pytest.approx(
            sorted(row["probabilities"]), abs=1e-4
        )


def test_the_server_announces_grpc_only_when_it_serves_it():
    from serving.server import endpoints_text

    on = endpoints_text(model_name="m", host="127.0.0.1", port=8501, grpc_port=8500)
    assert "grpc://127.0.0.1:8500" in on and "REST and gRPC APIs" in on
    off = endpoints_text(model_name="m", host="127.0.0.1", port=8501, grpc_port=0)
    assert off.startswith("http://127.0.0.1:8501/v1/models/m ")
    assert "grpc://" not in off and "gRPC APIs" not in off and "gRPC off" in off


def test_csv_cells_take_the_model_input_dtypes(served):
    """Numeric columns are numbers (float_list), whole or not; an integer input (here a column
    typed "int", as an integer category would be) takes whole numbers only, naming line and
    column."""
    from fullthrottle.commands.predict import DataError, csv_to_examples, raw_input_kinds
    from fullthrottle.core.config import load_config

    status, metadata = _get(served["base"] + "/metadata")
    assert status == 200, metadata
    kinds = raw_input_kinds(metadata)
    assert {kinds[name] for name in NUMERIC} == {"float"} and kinds["island"] == "bytes"
    config = load_config(None)
    header = "island,bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g,sex,year\n"
    examples, lines = csv_to_examples(
        header + "Biscoe,50.0,15.2,218,5700.5,,2008\n", config, source="rows.csv", kinds=kinds
    )
    features = tf.train.Example.FromString(examples[0]).features.feature
    assert list(features["flipper_length_mm"].float_list.value) == [218.0]
    assert list(features["body_mass_g"].float_list.value) == [5700.5]
    assert "sex" not in features and lines == [2]
    as_integer = {**kinds, "year": "int"}
    examples, _ = csv_to_examples(
        header + "Biscoe,50.0,15.2,218,5700,male,2008.0\n",
        config,
        source="rows.csv",
        kinds=as_integer,
    )
    assert list(
        tf.train.Example.FromString(examples[0]).features.feature["year"].int64_list.value
    ) == [2008]
    with pytest.raises(DataError, match=r"rows.csv, line 2: column 'year' takes whole"):
        csv_to_examples(
            header + "Biscoe,50.0,15.2,218,5700,male,2008.5\n",
            config,
            source="rows.csv",
            kinds=as_integer,
        )


def test_metadata_route_describes_each_signature(served):
    version = max(version_dirs(served["dir"]))
    status, reply = _get(served["base"] + "/metadata")
    assert status == 200, reply
    assert reply["model_spec"] == {
        "name": "penguins",
        "signature_name": "",
        "version": str(version),
    }
    signatures = reply["metadata"]["signature_def"]["signature_def"]
    # Every signature of saved_model.pb, as TF Serving shows them.
    assert sorted(signatures) == [
        "__saved_model_init_op",
        "classification",
        "predict_raw",
        "predict_transformed",
        "serving_default",
        "transform_features",
    ]
    assert signatures["classification"]["method_name"] == "tensorflow/serving/classify"
    assert signatures["serving_default"]["method_name"] == "tensorflow/serving/predict"
    examples = signatures["serving_default"]["inputs"]["examples"]
    assert examples["dtype"] == "DT_STRING" and examples["name"] == "serving_default_examples:0"
    assert examples["tensor_shape"]["dim"] == [{"size": "-1", "name": ""}]
    probabilities = signatures["serving_default"]["outputs"]["probabilities"]
    assert probabilities["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in probabilities["tensor_shape"]["dim"]] == ["-1", "3"]
    raw = signatures["predict_raw"]["inputs"]
    assert {raw[name]["dtype"] for name in NUMERIC} == {"DT_FLOAT"}
    assert raw["island"]["dtype"] == "DT_STRING"
    assert _get(f"{served['base']}/versions/{version}/metadata") == (status, reply)
    assert _get(f"{served['base']}/versions/7/metadata")[0] == 404


def test_every_numeric_feature_takes_215_and_215_0(served):
    """JSON 215 and 215.0 are the same number for every numeric feature, in predict_raw (row and
    columnar) and in :classify (where TF Serving makes 215 an int64_list, 215.0 a float_list)."""
    whole = dict(WHOLE_PENGUIN)
    as_integers = {**whole, **{name: int(whole[name]) for name in NUMERIC}}
    answers = []
    for row in (whole, as_integers):
        status, reply, _ = _post(
            served["base"] + ":predict", {"signature_name": "predict_raw", "instances": [row]}
        )
        assert status == 200, reply
        answers.append(reply["predictions"][0]["probabilities"])
        status, reply, _ = _post(
            served["base"] + ":predict",
            {"signature_name": "predict_raw", "inputs": {k: [v] for k, v in row.items()}},
        )
        assert status == 200, reply
        answers.append(reply["outputs"]["probabilities"][0])
        status, reply, _ = _post(
            served["base"] + ":classify", {"signature_name": "classification", "examples": [row]}
        )
        assert status == 200, reply
        answers.append([score for _, score in reply["results"][0]])
    for answer in answers[1:]:
        np.testing.assert_allclose(answer, answers[0], atol=1e-6)


def test_classify_answers_the_models_probabilities(served):
    examples, _ = _rows(served["last"], limit=8)
    model = tf.saved_model.load(served["last"]["pushed_model_dir"])
    expected = model.signatures["serving_default"](examples=tf.constant(examples))
    class_names = [c.decode() for c in expected["classes"].numpy()]
    status, reply, _ = _post(
        served["base"] + ":classify",
        {
            "signature_name": "classification",
            "examples": [_example_json(e) for e in examples],
        },
    )
    assert status == 200, reply
    results = reply["results"]
    np.testing.assert_allclose(
        [[score for _, score in row] for row in results],
        expected["probabilities"].numpy(),
        atol=1e-6,
    )
    assert [max(row, key=lambda pair: pair[1])[0] for row in results] == class_names


def _example_json(serialized: bytes) -> dict:
    """A tf.Example as TF Serving's classify JSON: int64 as integers, floats with a point."""
    features = tf.train.Example.FromString(serialized).features.feature
    body = {}
    for name, feature in features.items():
        if feature.int64_list.value:
            body[name] = list(feature.int64_list.value)
        elif feature.float_list.value:
            body[name] = [float(v) for v in feature.float_list.value]
        elif feature.bytes_list.value:
            body[name] = [v.decode() for v in feature.bytes_list.value]
    return body


def test_champion_label_follows_the_mlflow_alias(served):
    version = max(version_dirs(served["dir"]))
    status, reply = _get(served["base"] + "/labels/champion")
    assert status == 200, reply
    assert reply["model_version_status"][0]["version"] == str(version)
    body = {"signature_name": "predict_raw", "instances": [_one_raw_instance(served)]}
    status, reply, headers = _post(served["base"] + "/labels/champion:predict", body)
    assert status == 200 and int(headers["x-fullthrottle-model-version"]) == version, reply


def test_grpc_answers_as_rest(served):
    """The official stubs: Predict (both signatures), Classify, GetModelMetadata, the label."""
    import grpc
    from tensorflow_serving.apis import (
        classification_pb2,
        predict_pb2,
        prediction_service_pb2_grpc,
    )

    examples, raw = _rows(served["last"], limit=6)
    version = max(version_dirs(served["dir"]))
    _, rest, _ = _post(
        served["base"] + ":predict",
        {"instances": [{"b64": base64.b64encode(e).decode()} for e in examples]},
    )
    with grpc.insecure_channel(served["grpc"]) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "penguins"
        request.model_spec.version_label = "champion"
        request.inputs["examples"].CopyFrom(tf.make_tensor_proto(examples, dtype=tf.string))
        response = stub.Predict(request, timeout=60)
        assert response.model_spec.version.value == version
        np.testing.assert_allclose(
            tf.make_ndarray(response.outputs["probabilities"]),
            [p["probabilities"] for p in rest["predictions"]],
            atol=1e-6,
        )
        assert [c.decode() for c in tf.make_ndarray(response.outputs["classes"])] == [
            p["classes"] for p in rest["predictions"]
        ]

        raw_request = predict_pb2.PredictRequest()
        raw_request.model_spec.name = "penguins"
        raw_request.model_spec.signature_name = "predict_raw"
        for name, values in raw.items():
            raw_request.inputs[name].CopyFrom(tf.make_tensor_proto(values))
        raw_response = stub.Predict(raw_request, timeout=60)
        columns = {k: [_json_value(x) for x in v] for k, v in raw.items()}
        _, rest_raw, _ = _post(
            served["base"] + ":predict", {"signature_name": "predict_raw", "inputs": columns}
        )
        np.testing.assert_allclose(
            tf.make_ndarray(raw_response.outputs["probabilities"]),
            rest_raw["outputs"]["probabilities"],
            atol=1e-6,
        )

        classify = classification_pb2.ClassificationRequest()
        classify.model_spec.name = "penguins"
        classify.model_spec.signature_name = "classification"
        for example in examples:
            classify.input.example_list.examples.add().ParseFromString(example)
        classified = stub.Classify(classify, timeout=60)
        np.testing.assert_allclose(
            [[c.score for c in row.classes] for row in classified.result.classifications],
            tf.make_ndarray(response.outputs["probabilities"]),
            atol=1e-6,
        )


def _predict_raw_request(rows: list[dict], *, version_label: str | None = None):
    """A gRPC Predict of predict_raw as a TF Serving client writes it: typed TensorProtos."""
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "penguins"
    request.model_spec.signature_name = "predict_raw"
    if version_label:
        request.model_spec.version_label = version_label
    for name in rows[0]:
        values = [row[name] for row in rows]
        if name in NUMERIC:
            request.inputs[name].CopyFrom(tf.make_tensor_proto(values, dtype=tf.float32))
        else:
            request.inputs[name].CopyFrom(tf.make_tensor_proto(values, dtype=tf.string))
    return request


def _argmax_classes(response, class_names: list[str]) -> list[str]:
    """TF Serving's example clients: the scores from float_val, shaped by tensor_shape."""
    scores = response.outputs["probabilities"]
    rows, width = (d.size for d in scores.tensor_shape.dim)
    values = np.array(scores.float_val).reshape(rows, width)
    return [class_names[int(np.argmax(row))] for row in values]


def _class_names(served) -> list[str]:
    status, reply, _ = _post(
        served["base"] + ":classify",
        {"signature_name": "classification", "examples": [WHOLE_PENGUIN]},
    )
    assert status == 200, reply
    return [label for label, _ in reply["results"][0]]


def test_grpc_client_reads_float_val_and_string_val(served):
    """As TF Serving's example clients read answers: float_val, string_val, tensor_shape; no
    tensor_content."""
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    rows = [WHOLE_PENGUIN, {**WHOLE_PENGUIN, "island": "Torgersen", "bill_depth_mm": 19.0}]
    with grpc.insecure_channel(served["grpc"]) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(_predict_raw_request(rows), timeout=60)
    probabilities = response.outputs["probabilities"]
    assert probabilities.tensor_content == b"" and len(probabilities.float_val) == 6
    assert [d.size for d in probabilities.tensor_shape.dim] == [2, 3]
    classes = [c.decode() for c in response.outputs["classes"].string_val]
    assert _argmax_classes(response, _class_names(served)) == classes
    status, rest, _ = _post(
        served["base"] + ":predict", {"signature_name": "predict_raw", "instances": rows}
    )
    assert status == 200 and [p["classes"] for p in rest["predictions"]] == classes


def test_async_grpc_client_counting_callbacks_finishes(served):
    """TF Serving's mnist_client pattern: futures whose done-callbacks count answers and read
    float_val; the client waits until every callback has come. An empty float_val (the answer
    in tensor_content) would make each callback fail and the count never finish."""
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    concurrency, total = 4, 24
    class_names = _class_names(served)
    done = threading.Condition()
    state = {"done": 0, "active": 0, "classes": [], "errors": []}

    def callback(future) -> None:
        try:
            if future.exception():
                state["errors"].append(str(future.exception()))
            else:
                response = future.result()
                scores = np.array(response.outputs["probabilities"].float_val)
                state["classes"].append(class_names[int(np.argmax(scores))])
        finally:
            with done:
                state["done"] += 1
                state["active"] -= 1
                done.notify_all()

    with grpc.insecure_channel(served["grpc"]) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for _ in range(total):
            with done:
                while state["active"] >= concurrency:
                    assert done.wait(timeout=60), "a callback never came"
                state["active"] += 1
            future = stub.Predict.future(_predict_raw_request([WHOLE_PENGUIN]), 60.0)
            future.add_done_callback(callback)
        with done:
            while state["done"] < total:
                assert done.wait(timeout=60), f"{state['done']} of {total} callbacks came"
    assert state["errors"] == []
    assert len(state["classes"]) == total and len(set(state["classes"])) == 1


def test_metadata_parses_strictly_into_signature_def_map(served):
    from google.protobuf import json_format
    from tensorflow_serving.apis import get_model_metadata_pb2

    status, reply = _get(served["base"] + "/metadata")
    assert status == 200, reply
    signature_map = json_format.ParseDict(
        reply["metadata"]["signature_def"], get_model_metadata_pb2.SignatureDefMap()
    )
    raw = signature_map.signature_def["predict_raw"]
    assert {name: raw.inputs[name].dtype for name in NUMERIC} == dict.fromkeys(NUMERIC, 1)
    assert signature_map.signature_def["classification"].method_name == (
        "tensorflow/serving/classify"
    )


def test_classify_takes_a_float_list_for_a_whole_number_column(served):
    """A tf.Example written with float_list for flipper_length_mm and body_mass_g (whole numbers
    in the bundled CSV) is classified, over gRPC and REST alike, as with an int64_list."""
    import grpc
    from tensorflow_serving.apis import classification_pb2, prediction_service_pb2_grpc

    def example(number_kind: str):
        features = {}
        for name, value in WHOLE_PENGUIN.items():
            if (
                name in NUMERIC
                and number_kind == "int64_list"
                and name in ("flipper_length_mm", "body_mass_g")
            ):
                features[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
            elif name in NUMERIC:
                features[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
            else:
                features[name] = tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[value.encode()])
                )
        return tf.train.Example(features=tf.train.Features(feature=features))

    scores = {}
    with grpc.insecure_channel(served["grpc"]) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for kind in ("float_list", "int64_list"):
            request = classification_pb2.ClassificationRequest()
            request.model_spec.name = "penguins"
            request.model_spec.signature_name = "classification"
            request.input.example_list.examples.append(example(kind))
            result = stub.Classify(request, timeout=60).result
            scores[kind] = [c.score for c in result.classifications[0].classes]
    np.testing.assert_allclose(scores["float_list"], scores["int64_list"], atol=1e-6)
    status, reply, _ = _post(
        served["base"] + ":predict",
        {
            "instances": [
                {"b64": base64.b64encode(example("float_list").SerializeToString()).decode()}
            ]
        },
    )
    assert status == 200, reply
    np.testing.assert_allclose(
        reply["predictions"][0]["probabilities"], scores["float_list"], atol=1e-6
    )


def test_multi_inference_answers_as_tf_serving_on_a_model_without_regression(served):
    import grpc
    from tensorflow_serving.apis import (
        classification_pb2,
        inference_pb2,
        prediction_service_pb2_grpc,
    )

    examples, _ = _rows(served["last"], limit=4)

    def request(*tasks):
        multi = inference_pb2.MultiInferenceRequest()
        for signature, method in tasks:
            task = multi.tasks.add()
            task.model_spec.name = "penguins"
            task.model_spec.signature_name = signature
            task.method_name = f"tensorflow/serving/{method}"
        for serialized in examples:
            multi.input.example_list.examples.add().ParseFromString(serialized)
        return multi

    with grpc.insecure_channel(served["grpc"]) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        answer = stub.MultiInference(request(("classification", "classify")), timeout=60)
        classify = classification_pb2.ClassificationRequest()
        classify.model_spec.name = "penguins"
        classify.model_spec.signature_name = "classification"
        classify.input.CopyFrom(request().input)
        assert answer.results[0].classification_result == stub.Classify(classify).result
        with pytest.raises(grpc.RpcError) as refused:
            stub.MultiInference(
                request(("classification", "classify"), ("regression", "regress")), timeout=60
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == "Requested signature not found in model graph: regression"
        # The server answers a valid request afterwards.
        assert stub.MultiInference(request(("classification", "classify")), timeout=60) == answer


def test_grpc_message_limit_is_the_configured_one(served):
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    rows = [WHOLE_PENGUIN] * 40_000  # about 1.4 MB as TensorProtos
    request = _predict_raw_request(rows)
    assert request.ByteSize() > GRPC_LIMIT
    with grpc.insecure_channel(served["grpc"]) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Predict(request, timeout=60)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        small = stub.Predict(_predict_raw_request(rows[:10]), timeout=60)
        assert len(small.outputs["classes"].string_val) == 10


def test_twenty_bundled_rows_get_the_same_class_everywhere(served, penguins_run, tmp_path):
    """The first 20 rows of the bundled penguins.csv, missing cells included: CSV `predict`,
    REST predict_raw with float numbers (row and columnar), gRPC float_val, :classify, and the
    MLflow model on `pandas.read_csv` agree on every class."""
    import mlflow.pyfunc
    import pandas as pd

    from fullthrottle.core.bundled import bundled_path
    from fullthrottle.core.config import BUNDLED_PENGUINS
    from fullthrottle.tracking.store import scoped_tracking_uri

    lines = bundled_path(BUNDLED_PENGUINS).read_text().splitlines()[:21]
    csv_file = tmp_path / "twenty.csv"
    csv_file.write_text("\n".join(lines) + "\n")
    frame = pd.read_csv(csv_file)  # NA cells -> NaN; columns with one float64
    assert frame.isna().any(axis=1).sum() >= 2  # rows with missing cells are among them
    features = frame.drop(columns=["species", "year"])
    url = served["base"].split("/v1/")[0]
    result = run_cli("predict", "--csv", str(csv_file), "--url", url, "--output", "json")
    assert result.returncode == 0, result.stderr[-2000:]
    by_csv = [r["classes"] for r in json.loads(result.stdout)]
    assert len(by_csv) == 20

    def json_row(row) -> dict:
        # A missing number is NaN and a missing text "" (the CSV's empty cell) in predict_raw.
        return {
            name: ("" if pd.isna(value) else value) if name not in NUMERIC else float(value)
            for name, value in row.items()
        }

    rows = [json_row(row) for _, row in features.iterrows()]
    status, reply, _ = _post(
        served["base"] + ":predict", {"signature_name": "predict_raw", "instances": rows}
    )
    assert status == 200, reply
    by_rest_rows = [p["classes"] for p in reply["predictions"]]
    columns = {name: [row[name] for row in rows] for name in rows[0]}
    status, reply, _ = _post(
        served["base"] + ":predict", {"signature_name": "predict_raw", "inputs": columns}
    )
    assert status == 200, reply
    by_rest_columns = reply["outputs"]["classes"]

    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    class_names = _class_names(served)
    with grpc.insecure_channel(served["grpc"]) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(_predict_raw_request(rows, version_label="champion"), timeout=60)
    by_grpc = _argmax_classes(response, class_names)

    examples = [
        {name: value for name, value in row.items() if value == value and value != ""}
        for row in rows
    ]  # a missing cell is left out of the tf.Example, as CsvExampleGen leaves it out
    status, reply, _ = _post(
        served["base"] + ":classify", {"signature_name": "classification", "examples": examples}
    )
    assert status == 200, reply
    by_classify = [max(row, key=lambda pair: pair[1])[0] for row in reply["results"]]

    output_dir, _ = penguins_run
    store = f"sqlite:///{output_dir / 'mlflow' / 'mlflow.db'}"
    with scoped_tracking_uri(store):
        model = mlflow.pyfunc.load_model("models:/penguins@champion", dst_path=str(tmp_path))
    by_mlflow = list(model.predict(features)["class"])

    assert by_rest_rows == by_csv
    assert by_rest_columns == by_csv
    assert by_grpc == by_csv
    assert by_classify == by_csv
    assert by_mlflow == by_csv


def test_predict_command_over_grpc(served, tmp_path):
    csv_file = tmp_path / "rows.csv"
    csv_file.write_text(
        "island,bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g,sex,year\n"
        "Torgersen,39.1,18.7,181,3750,male,2007\n"
        "Biscoe,50.0,15.2,218,5700,,2008\n"
    )
    grpc_result = run_cli(
        "predict", "--csv", str(csv_file), "--grpc", served["grpc"], "--output", "json"
    )
    assert grpc_result.returncode == 0, grpc_result.stderr[-2000:]
    assert "note:" not in grpc_result.stderr  # the cells were typed by GetModelMetadata
    rows = json.loads(grpc_result.stdout)
    assert [r["classes"] for r in rows] == ["Adelie", "Gentoo"]
    assert all(abs(sum(r["probabilities"]) - 1) < 1e-5 for r in rows)
    _assert_text_names_each_probability(["--csv", str(csv_file), "--grpc", served["grpc"]], rows)
    unknown = run_cli("predict", "--csv", str(csv_file), "--grpc", served["grpc"], "--version", "7")
    assert unknown.returncode == 2 and "NOT_FOUND" in unknown.stderr, unknown.stderr[-2000:]
    assert "Traceback" not in unknown.stderr


def test_new_version_is_picked_up_without_a_failed_request(served):
    serving_dir = served["dir"]
    old = max(version_dirs(serving_dir))
    instance = _one_raw_instance(served)
    body = {"signature_name": "predict_raw", "instances": [instance]}
    answered: list[int] = []  # in the order the answers arrived
    timed: list[tuple[float, float, int]] = []  # (sent, answered, version) per request
    failures: list[str] = []
    incomplete: list[str] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                status, reply, headers = _post(served["base"] + ":predict", body)
            except OSError as exc:  # a timeout or refused connection is a failed request too
                failures.append(f"{type(exc).__name__}: {exc}")
                continue
            if status != 200:
                failures.append(f"{status} {reply}")
            else:
                version = int(headers["x-fullthrottle-model-version"])
                timed.append((sent, time.monotonic(), version))
                answered.append(version)

    def watcher() -> None:
        # Every integer folder must be complete whenever it is visible.
        while not stop.is_set():
            for path in version_dirs(serving_dir).values():
                if not is_complete(path) or not os.path.isfile(
                    os.path.join(path, "assets.extra", "tf_serving_warmup_requests")
                ):
                    incomplete.append(path)
            time.sleep(0.005)

    threads = [threading.Thread(target=client) for _ in range(2)] + [
        threading.Thread(target=watcher)
    ]
    for thread in threads:
        thread.start()
    try:
        examples = [
            strip_label(r, "species") for r in eval_split_examples(served["last"], limit=16)
        ]
        new = push_model(
            model_dir=served["last"]["pushed_model_dir"],
            serving_dir=str(serving_dir),
            model_name="penguins",
            warmup_examples=examples,
            warmup_count=16,
        ).version
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not answered or answered[-1] != new):
            time.sleep(0.1)
        time.sleep(0.5)  # more requests on the new version
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    assert incomplete == []
    assert answered[0] == old and answered[-1] == new, (answered[:3], answered[-3:])
    # Once switched, never back (the switch is one assignment): every request sent after the
    # first answer from the new version is answered by it. Order of arrival is not the test: with
    # two clients, a request the old version was still answering can arrive after a newer one.
    switched = min(done for _, done, version in timed if version == new)
    assert {version for sent, _, version in timed if sent > switched} == {new}
    # Both in the status: the old one stays loaded while the `champion` label names it.
    status, reply = _get(served["base"])
    assert status == 200, reply
    states = {int(v["version"]): v["state"] for v in reply["model_version_status"]}
    assert states == {new: "AVAILABLE", old: "AVAILABLE"}
