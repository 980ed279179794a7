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
        "must only have keys",
    ),
    "empty instances": (lambda i: {"instances": []}, 400, "No values in 'instances' array"),
    "unknown signature": (
        lambda i: {"signature_name": "nope", "instances": [i]},
        400,
        'Serving signature key "nope" not found.',
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
    status, reply, _ = _post(served["base"] + ":predict", body)
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
    """int64 inputs get int64 values (3750.0 too), 3750.5 is refused naming line and column."""
    from fullthrottle.commands.predict import DataError, csv_to_examples, raw_input_kinds
    from fullthrottle.core.config import load_config

    status, metadata = _get(served["base"] + "/metadata")
    assert status == 200, metadata
    kinds = raw_input_kinds(metadata)
    assert kinds["body_mass_g"] == "int" and kinds["bill_length_mm"] == "float"
    assert kinds["island"] == "bytes"
    config = load_config(None)
    header = "island,bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g,sex,year\n"
    examples, lines = csv_to_examples(
        header + "Biscoe,50.0,15.2,218.0,5700,,2008\n", config, source="rows.csv", kinds=kinds
    )
    features = tf.train.Example.FromString(examples[0]).features.feature
    assert list(features["body_mass_g"].int64_list.value) == [5700]
    assert list(features["flipper_length_mm"].int64_list.value) == [218]
    assert list(features["bill_length_mm"].float_list.value) == [50.0]
    assert "sex" not in features and lines == [2]
    with pytest.raises(DataError, match=r"rows.csv, line 2: column 'body_mass_g' takes whole"):
        csv_to_examples(
            header + "Biscoe,50.0,15.2,218,5700.5,male,2008\n",
            config,
            source="rows.csv",
            kinds=kinds,
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
    assert raw["body_mass_g"]["dtype"] == "DT_INT64" and raw["island"]["dtype"] == "DT_STRING"
    assert _get(f"{served['base']}/versions/{version}/metadata") == (status, reply)
    assert _get(f"{served['base']}/versions/7/metadata")[0] == 404


def test_int64_raw_input_takes_json_integers_only(served):
    """As TF Serving: an int64 input takes a JSON integer; 3750.0 and 3750.5 are refused."""
    instance = {**_one_raw_instance(served), "body_mass_g": 3750}
    url = served["base"] + ":predict"
    status, as_int, _ = _post(url, {"signature_name": "predict_raw", "instances": [instance]})
    assert status == 200, as_int
    for number in (3750.0, 3750.5):
        refused = {**instance, "body_mass_g": number}
        status, reply, _ = _post(url, {"signature_name": "predict_raw", "instances": [refused]})
        assert status == 400, reply
        assert "key: body_mass_g" in reply["error"]
        assert "is not of expected type: int64" in reply["error"], reply


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
