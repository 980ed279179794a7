"""`fullthrottle serve` answers TF Serving's REST and gRPC APIs as TF Serving does.

One real server process on random 127.0.0.1 ports serves two versions of a small real
SavedModel (`tests/serving_models.py`: predict signatures with bool inputs and a `_bytes`
output, a classification and a regression signature), with the labels `stable` -> 1 and
`canary` -> 2. The requests and expected answers follow TF Serving's REST API documentation and
its own handler tests (json_tensor.cc, http_rest_api_handler_test.cc): response shapes, status
codes and the substance of the error messages. The gRPC tests use the official
`tensorflow-serving-api` stubs. The fuzz tests generate requests from `serving/openapi.yaml`
(schemathesis) and send a corpus of malformed bodies.
"""

from __future__ import annotations

import base64
import json
import socket
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
import yaml
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from fullthrottle.bench.serving import free_port, start_server, stop_server
from tests.helpers import REPO
from tests.serving_models import write_contract_model

pytestmark = pytest.mark.slow

MODEL = "contract"
SCALES = {1: 2.0, 2: 3.0}  # version -> the model's scale
LABELS = {"stable": 1, "canary": 2}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract") / MODEL
    for version, scale in SCALES.items():
        write_contract_model(root / str(version), scale=scale)
    port, grpc_port = free_port(), free_port()
    # A YAML config rather than --set: `--config` is also a prefix of a flag KServe parses from
    # argv at import, which the server must not let KServe read.
    config_file = root.parent / "contract.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "tracking": {"enabled": False},
                "serving": {
                    "serve_versions": 2,
                    "max_request_bytes": 1_000_000,
                    "version_labels": LABELS,
                },
            }
        )
    )
    process = start_server(
        str(root), model_name=MODEL, port=port, grpc_port=grpc_port, config_file=str(config_file)
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    yield {
        "root": f"http://127.0.0.1:{port}",
        "base": f"http://127.0.0.1:{port}/v1/models/{MODEL}",
        "port": port,
        "predictions": prediction_service_pb2_grpc.PredictionServiceStub(channel),
        "models": model_service_pb2_grpc.ModelServiceStub(channel),
    }
    channel.close()
    output = stop_server(process)
    assert "Traceback" not in output, output[-3000:]


def _request(
    url: str, body: bytes | dict | None = None, *, method: str | None = None, headers=None
) -> tuple[int, bytes, dict]:
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def _b64(raw: bytes) -> dict:
    return {"b64": base64.b64encode(raw).decode()}


# (name, method, path after /v1/models/contract, body, status, expected JSON or error substring)
STATUS_V2 = {
    "version": "2",
    "state": "AVAILABLE",
    "status": {"error_code": "OK", "error_message": ""},
}
STATUS_V1 = {**STATUS_V2, "version": "1"}
ROW = {"instances": [{"x": 1.5, "flag": True}, {"x": 2.0, "flag": False}]}
CASES = [
    ("status", "GET", "", None, 200, {"model_version_status": [STATUS_V2, STATUS_V1]}),
    ("status of a version", "GET", "/versions/1", None, 200, {"model_version_status": [STATUS_V1]}),
    (
        "status of a label",
        "GET",
        "/labels/canary",
        None,
        200,
        {"model_version_status": [STATUS_V2]},
    ),
    (
        "row predict, several outputs: an object per instance, _bytes as b64",
        "POST",
        ":predict",
        ROW,
        200,
        {
            "predictions": [
                {"y": 4.5, "id_bytes": _b64(b"\xff\x00true"), "label": "on"},
                {"y": 0.0, "id_bytes": _b64(b"\xff\x00false"), "label": "off"},
            ]
        },
    ),
    (
        "columnar predict, several outputs: an object of outputs",
        "POST",
        ":predict",
        {"inputs": {"x": [1.5, 2.0], "flag": [True, False]}},
        200,
        {
            "outputs": {
                "y": [4.5, 0.0],
                "id_bytes": [_b64(b"\xff\x00true"), _b64(b"\xff\x00false")],
                "label": ["on", "off"],
            }
        },
    ),
    (
        "row predict, one input and output: plain values",
        "POST",
        ":predict",
        {"signature_name": "half", "instances": [1.0, 0.2]},
        200,
        {"predictions": [0.5, 0.1]},
    ),
    (
        "columnar predict, one output: the name is dropped",
        "POST",
        ":predict",
        {"signature_name": "half", "inputs": [3.0, 4.0]},
        200,
        {"outputs": [1.5, 2.0]},
    ),
    (
        "unknown top-level keys are ignored",
        "POST",
        ":predict",
        {"signature_name": "half", "instances": [1.0], "client": {"id": 7}},
        200,
        {"predictions": [0.5]},
    ),
    ("a version", "POST", "/versions/1:predict", ROW, 200, None),
    (
        "a label",
        "POST",
        "/labels/stable:predict",
        {"instances": [{"x": 1.5, "flag": True}]},
        200,
        {"predictions": [{"y": 3.0, "id_bytes": _b64(b"\xff\x00true"), "label": "on"}]},
    ),
    (
        "classify",
        "POST",
        ":classify",
        {"signature_name": "classify_x", "examples": [{"x": 0.0}]},
        200,
        {"results": [[["neg", 0.5], ["pos", 0.5]]]},
    ),
    (
        "classify with context",
        "POST",
        "/labels/stable:classify",
        {"signature_name": "classify_x", "context": {"x": 0.0}, "examples": [{}, {"x": 0.0}]},
        200,
        {"results": [[["neg", 0.5], ["pos", 0.5]], [["neg", 0.5], ["pos", 0.5]]]},
    ),
    (
        "regress",
        "POST",
        ":regress",
        {"signature_name": "regress_x", "examples": [{"x": 80.0}]},
        200,
        {"results": [240.0]},
    ),
    (
        "regress a version",
        "POST",
        "/versions/1:regress",
        {"signature_name": "regress_x", "examples": [{"x": 80.0}, {"x": 0.5}]},
        200,
        {"results": [160.0, 1.0]},
    ),
    # Errors: TF Serving's status code and message.
    (
        "unknown model",
        "POST",
        "@other:predict",
        ROW,
        404,
        "Servable not found for request: Latest(other)",
    ),
    (
        "unknown version",
        "POST",
        "/versions/7:predict",
        ROW,
        404,
        "Servable not found for request: Specific(contract, 7)",
    ),
    (
        "unknown label",
        "POST",
        "/labels/nope:predict",
        ROW,
        400,
        "Unrecognized servable version label: nope",
    ),
    (
        "status of an unknown version",
        "GET",
        "/versions/7",
        None,
        404,
        "Could not find version 7 of model contract",
    ),
    (
        "version too large",
        "POST",
        "/versions/99999999999999999999:predict",
        ROW,
        400,
        "Failed to convert version",
    ),
    ("malformed path", "POST", "/version/1:predict", ROW, 400, "Malformed request"),
    ("empty body", "POST", ":predict", b"", 400, "JSON Parse error: The document is empty"),
    ("not JSON", "POST", ":predict", b"instances = [1, 2]", 400, "JSON Parse error: Invalid value"),
    ("not an object", "POST", ":predict", b"[1]", 400, "Is not object"),
    (
        "signature_name not a string",
        "POST",
        ":predict",
        {"signature_name": 100},
        400,
        "'signature_name' key must be a string value.",
    ),
    (
        "unknown signature",
        "POST",
        ":predict",
        {"signature_name": "nope", "instances": [1.0]},
        400,
        'Serving signature key "nope" not found.',
    ),
    (
        "neither key",
        "POST",
        ":predict",
        {"signature_name": "half"},
        400,
        "Missing 'inputs' or 'instances' key",
    ),
    (
        "both keys",
        "POST",
        ":predict",
        {"instances": [1.0], "inputs": [1.0]},
        400,
        "expecting only one of 'inputs' or 'instances' keys to exist",
    ),
    (
        "instances not a list",
        "POST",
        ":predict",
        {"instances": {"x": 1.0}},
        400,
        "'instances' to be an list/array",
    ),
    (
        "empty instances",
        "POST",
        ":predict",
        {"instances": []},
        400,
        "No values in 'instances' array",
    ),
    (
        "wrong type",
        "POST",
        ":predict",
        {"signature_name": "half", "instances": ["x", "y"]},
        400,
        "is not of expected type: float",
    ),
    (
        "bool input given a number",
        "POST",
        ":predict",
        {"instances": [{"x": 1.0, "flag": 1}]},
        400,
        "is not of expected type: bool",
    ),
    (
        "float input that float32 cannot hold",
        "POST",
        ":predict",
        {"signature_name": "half", "instances": [16777217]},
        400,
        "without loss of precision",
    ),
    (
        "missing input in an instance",
        "POST",
        ":predict",
        {"instances": [{"x": 1.0}]},
        400,
        "must only have keys: flag,x",
    ),
    (
        "unknown input in an instance",
        "POST",
        ":predict",
        {"instances": [{"x": 1.0, "flag": True, "z": 1}]},
        400,
        "does not have named input: z",
    ),
    (
        "plain list for two inputs",
        "POST",
        ":predict",
        {"instances": [1.0]},
        400,
        "instances is a plain list, but expecting list of objects",
    ),
    (
        "missing input in columnar",
        "POST",
        ":predict",
        {"inputs": {"x": [1.0]}},
        400,
        "Missing named input: flag in 'inputs' object.",
    ),
    (
        "ragged instance",
        "POST",
        ":predict",
        {"signature_name": "half", "instances": [[1.0, 2.0], [1.0]]},
        400,
        "Expecting",
    ),
    (
        "shape the signature does not take",
        "POST",
        ":predict",
        {"inputs": {"x": [1.0, 2.0], "flag": [True]}},
        400,
        "shapes",
    ),
    (
        "classify on a predict signature",
        "POST",
        ":classify",
        {"examples": [{"x": 1.0}]},
        400,
        "Expected classification signature method_name to be tensorflow/serving/classify",
    ),
    (
        "regress without examples",
        "POST",
        ":regress",
        {"signature_name": "regress_x"},
        400,
        "key 'examples' is expected and was not found",
    ),
    (
        "an example that is not an object",
        "POST",
        ":regress",
        {"signature_name": "regress_x", "examples": [1]},
        400,
        "Example must be JSON object",
    ),
    (
        "a feature of two kinds",
        "POST",
        ":regress",
        {"signature_name": "regress_x", "examples": [{"x": [1.0, "a"]}]},
        400,
        "Unexpected element type in feature: x",
    ),
    (
        "a feature the model reads as float, sent as int64",
        "POST",
        ":regress",
        {"signature_name": "regress_x", "examples": [{"x": 1}]},
        400,
        "x",
    ),
    ("PUT", "PUT", ":predict", ROW, 400, "Malformed request"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rest_api_as_documented(api, case):
    _, method, path, body, status, expected = case
    # "@other..." addresses another model name; every other path is under /v1/models/contract.
    url = api["root"] + "/v1/models/" + path[1:] if path.startswith("@") else api["base"] + path
    code, raw, headers = _request(url, body, method=method)
    assert code == status, raw[:2000]
    assert headers.get("content-type", "").startswith("application/json")
    reply = json.loads(raw)
    if isinstance(expected, str):
        assert set(reply) == {"error"} and expected in reply["error"], reply
    elif expected is not None:
        # Exact equality: TF Serving writes float32 values as their shortest decimals.
        assert reply == expected


def test_version_and_label_answer_their_version(api):
    body = {"instances": [{"x": 1.5, "flag": True}]}
    for path, version in (
        ("/versions/1", 1), ("/versions/2", 2), ("/labels/stable", 1), ("/labels/canary", 2), ("", 2)
    ):  # fmt: skip
        code, raw, headers = _request(f"{api['base']}{path}:predict", body)
        assert code == 200, raw
        assert json.loads(raw)["predictions"][0]["y"] == 1.5 * SCALES[version]
        assert headers["x-fullthrottle-model-version"] == str(version)


def test_nan_and_infinity_are_numbers_both_ways(api):
    code, raw, _ = _request(
        api["base"] + ":predict",
        b'{"signature_name": "half", "instances": [NaN, Infinity, -Infinity, 1e-3]}',
    )
    assert code == 200, raw
    assert raw.replace(b" ", b"") == b'{"predictions":[NaN,Infinity,-Infinity,0.0005]}'
    # A literal beyond double range is refused, as TF Serving's parser does.
    code, raw, _ = _request(
        api["base"] + ":predict", b'{"signature_name": "half", "instances": [1e999]}'
    )
    assert code == 400 and b"Number too big" in raw, raw


def test_metadata_is_tf_servings_signature_def_map(api):
    code, raw, _ = _request(api["base"] + "/versions/1/metadata")
    assert code == 200, raw
    reply = json.loads(raw)
    assert reply["model_spec"] == {"name": MODEL, "signature_name": "", "version": "1"}
    signature_map = reply["metadata"]["signature_def"]
    assert signature_map["@type"] == "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    signatures = signature_map["signature_def"]
    assert set(signatures) == {
        "serving_default",
        "half",
        "regress_x",
        "classify_x",
        "__saved_model_init_op",
    }
    default = signatures["serving_default"]
    assert default["method_name"] == "tensorflow/serving/predict"
    assert default["inputs"]["x"]["name"] == "serving_default_x:0"
    assert default["inputs"]["flag"]["dtype"] == "DT_BOOL"
    assert default["inputs"]["x"]["tensor_shape"] == {
        "dim": [{"size": "-1", "name": ""}],
        "unknown_rank": False,
    }
    assert signatures["regress_x"]["method_name"] == "tensorflow/serving/regress"
    assert signatures["classify_x"]["method_name"] == "tensorflow/serving/classify"
    assert signatures["classify_x"]["outputs"]["classes"]["dtype"] == "DT_STRING"


# ---------------------------------------------------------------------------- gRPC
def _spec(request, *, version=None, label=None, signature=""):
    request.model_spec.name = MODEL
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    request.model_spec.signature_name = signature
    return request


SELECTORS = [
    ({"version": 1}, "/versions/1", 1),
    ({"version": 2}, "/versions/2", 2),
    ({"label": "stable"}, "/labels/stable", 1),
    ({"label": "canary"}, "/labels/canary", 2),
]


@pytest.mark.parametrize("selector,path,version", SELECTORS, ids=[s[1] for s in SELECTORS])
def test_grpc_answers_as_rest_for_versions_and_labels(api, selector, path, version):
    xs, flags = [1.5, -2.25, 0.1], [True, True, False]
    request = _spec(predict_pb2.PredictRequest(), **selector)
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(xs, np.float32)))
    request.inputs["flag"].CopyFrom(tf.make_tensor_proto(np.array(flags)))
    response = api["predictions"].Predict(request, timeout=30)
    assert response.model_spec.version.value == version
    assert response.model_spec.signature_name == "serving_default"
    grpc_out = {k: tf.make_ndarray(v) for k, v in response.outputs.items()}
    code, raw, _ = _request(f"{api['base']}{path}:predict", {"inputs": {"x": xs, "flag": flags}})
    assert code == 200, raw
    rest_out = json.loads(raw)["outputs"]
    np.testing.assert_array_equal(grpc_out["y"], np.array(rest_out["y"], np.float32))
    assert [base64.b64decode(v["b64"]) for v in rest_out["id_bytes"]] == list(grpc_out["id_bytes"])
    assert grpc_out["y"][0] == np.float32(1.5 * SCALES[version])

    classify = _spec(classification_pb2.ClassificationRequest(), signature="classify_x", **selector)
    for x in xs:
        classify.input.example_list.examples.add().features.feature["x"].float_list.value.append(x)
    classified = api["predictions"].Classify(classify, timeout=30)
    code, raw, _ = _request(
        f"{api['base']}{path}:classify",
        {"signature_name": "classify_x", "examples": [{"x": x} for x in xs]},
    )
    assert code == 200, raw
    rest_results = json.loads(raw)["results"]
    assert [[c.label for c in row.classes] for row in classified.result.classifications] == [
        [label for label, _ in row] for row in rest_results
    ]
    np.testing.assert_allclose(
        [[c.score for c in row.classes] for row in classified.result.classifications],
        [[score for _, score in row] for row in rest_results],
        rtol=1e-6,
    )

    regress = _spec(regression_pb2.RegressionRequest(), signature="regress_x", **selector)
    context = regress.input.example_list_with_context
    context.context.features.feature["x"].float_list.value.append(4.0)
    context.examples.add()  # takes x from the context
    context.examples.add().features.feature["x"].float_list.value.append(1.0)
    regressed = api["predictions"].Regress(regress, timeout=30)
    assert [r.value for r in regressed.result.regressions] == [
        4.0 * SCALES[version],
        SCALES[version],
    ]
    assert regressed.model_spec.version.value == version


def test_grpc_metadata_and_status_match_rest(api):
    from google.protobuf import json_format

    request = _spec(get_model_metadata_pb2.GetModelMetadataRequest(), label="stable")
    request.metadata_field.append("signature_def")
    response = api["predictions"].GetModelMetadata(request, timeout=30)
    assert response.model_spec.version.value == 1
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signature_map)
    _, raw, _ = _request(api["base"] + "/versions/1/metadata")
    rest = json.loads(raw)["metadata"]["signature_def"]["signature_def"]
    grpc_map = json_format.MessageToDict(
        signature_map, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )["signature_def"]
    assert grpc_map == rest

    status = api["models"].GetModelStatus(
        _spec(get_model_status_pb2.GetModelStatusRequest()), timeout=30
    )
    assert [(s.version, get_model_status_pb2.ModelVersionStatus.State.Name(s.state)) for s in status.model_version_status] == [
        (2, "AVAILABLE"), (1, "AVAILABLE")
    ]  # fmt: skip


GRPC_ERRORS = [
    ("unknown model", dict(name="other"), grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(other)"),
    ("unknown version", dict(version=7), grpc.StatusCode.NOT_FOUND, "Specific(contract, 7)"),
    ("unknown label", dict(label="nope"), grpc.StatusCode.INVALID_ARGUMENT, "Unrecognized servable version label: nope"),
    ("unknown signature", dict(signature="nope"), grpc.StatusCode.FAILED_PRECONDITION, 'Serving signature key "nope" not found.'),
    ("wrong dtype", dict(x=np.array(["a"])), grpc.StatusCode.INVALID_ARGUMENT, "Expects arg[x] to be float"),
    ("missing input", dict(drop="flag"), grpc.StatusCode.INVALID_ARGUMENT, "Missing but required: ['flag']"),
]  # fmt: skip


@pytest.mark.parametrize("case", GRPC_ERRORS, ids=[c[0] for c in GRPC_ERRORS])
def test_grpc_errors_have_tf_servings_codes(api, case):
    _, spec, code, message = case
    request = predict_pb2.PredictRequest()
    request.model_spec.name = spec.get("name", MODEL)
    if "version" in spec:
        request.model_spec.version.value = spec["version"]
    if "label" in spec:
        request.model_spec.version_label = spec["label"]
    request.model_spec.signature_name = spec.get("signature", "")
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(spec.get("x", np.array([1.0], np.float32))))
    if spec.get("drop") != "flag":
        request.inputs["flag"].CopyFrom(tf.make_tensor_proto(np.array([True])))
    with pytest.raises(grpc.RpcError) as raised:
        api["predictions"].Predict(request, timeout=30)
    assert raised.value.code() == code
    assert message in raised.value.details()


def test_server_listens_only_where_told(api):
    """The REST port is bound to 127.0.0.1, not every interface (KServe's default is 0.0.0.0)."""
    with socket.socket() as probe:
        probe.settimeout(2)
        assert probe.connect_ex(("127.0.0.2", api["port"])) != 0


# ---------------------------------------------------------------------------- fuzzing
FUZZ_COUNTS = {"requests": 0, "2xx": 0, "4xx": 0, "5xx": 0}


def _check_answer(status: int, raw: bytes, where: str) -> None:
    FUZZ_COUNTS["requests"] += 1
    bucket = f"{status // 100}xx"
    FUZZ_COUNTS[bucket] = FUZZ_COUNTS.get(bucket, 0) + 1
    assert status < 500, f"{where}: {status} {raw[:500]!r}"
    reply = json.loads(raw)  # every answer is JSON, errors included
    if status >= 400:
        assert set(reply) == {"error"} and isinstance(reply["error"], str) and reply["error"], (
            f"{where}: {raw[:500]!r}"
        )
        assert "Traceback" not in reply["error"]


def _still_serving(api) -> None:
    code, raw, _ = _request(
        api["base"] + ":predict", {"signature_name": "half", "instances": [2.0]}
    )
    assert code == 200 and json.loads(raw) == {"predictions": [1.0]}, raw


def test_fuzz_from_the_openapi_description(api):
    import hypothesis
    import schemathesis
    from hypothesis import HealthCheck, settings

    schema = schemathesis.openapi.from_path(REPO / "serving" / "openapi.yaml")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 12
    for operation in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            for path_parameters in (None, {"model_name": MODEL}):
                strategy = operation.as_strategy(mode, path_parameters=path_parameters)

                @settings(
                    max_examples=12,
                    deadline=None,
                    database=None,
                    derandomize=True,
                    suppress_health_check=list(HealthCheck),
                )
                @hypothesis.given(case=strategy)
                def send(case):
                    response = case.call(base_url=api["root"], timeout=60)
                    _check_answer(
                        response.status_code,
                        response.content,
                        f"{case.method} {case.formatted_path}",
                    )

                try:
                    send()
                except hypothesis.errors.Unsatisfiable:
                    # Negative mode with every parameter fixed: nothing left to make invalid.
                    assert mode == schemathesis.GenerationMode.NEGATIVE
    _still_serving(api)
    print(f"\nfuzz (OpenAPI): {FUZZ_COUNTS}")
    assert FUZZ_COUNTS["requests"] >= 200 and FUZZ_COUNTS["5xx"] == 0


MALFORMED_BODIES = {
    "wrong types": b'{"instances": [{"x": {"nested": [1]}, "flag": "yes"}]}',
    "huge array, one bad value at its end": b'{"signature_name": "half", "instances": ['
    + b",".join([b"1.5"] * 60000)
    + b',"x"]}',
    "huge array of the wrong shape": b'{"instances": ['
    + b",".join([b"[1.5, 2.5]"] * 30000)
    + b"]}",
    "deep nesting": b'{"instances": ' + b"[" * 100000 + b"]" * 100000 + b"}",
    "deep nesting of objects": b'{"context": ' + b'{"a":' * 50000 + b"1" + b"}" * 50000 + b"}",
    "bad UTF-8 in a string": b'{"signature_name": "\xff\xfe", "instances": [1.0]}',
    "bad UTF-8 outside strings": b"\xff\xfe{}",
    "bad UTF-8 as a string input": b'{"signature_name": "regress_x", "examples": [{"x": "\xc3\x28"}]}',
    "empty body": b"",
    "only whitespace": b"   \n",
    "NUL bytes": b'{"instances": [\x00]}',
    "a number too long": b'{"signature_name": "half", "instances": [' + b"9" * 5000 + b"]}",
    "a key too long": b'{"' + b"k" * 500000 + b'": 1}',
    "truncated": b'{"instances": [{"x": 1.0, "flag": tr',
    "two documents": b'{"instances": [1.0]} {"instances": [1.0]}',
    "base64 that is not": b'{"signature_name": "regress_x", "examples": [{"x": {"b64": "!!!"}}]}',
    "over the size limit": b'{"instances": ["' + b"a" * 1_100_000 + b'"]}',
}
CONTENT_TYPES = [
    "application/json",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    None,
]


@pytest.mark.parametrize("name", sorted(MALFORMED_BODIES))
def test_malformed_bodies_get_tf_serving_errors(api, name):
    for path in (":predict", ":classify", ":regress", "/labels/canary:predict"):
        for content_type in CONTENT_TYPES:
            headers = {"Content-Type": content_type} if content_type else {}
            code, raw, _ = _request(
                api["base"] + path, MALFORMED_BODIES[name], method="POST", headers=headers
            )
            _check_answer(code, raw, f"{name} -> {path} ({content_type})")
            assert 400 <= code < 500, raw[:500]
    _still_serving(api)
