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
from typing import NamedTuple

import grpc
import numpy as np
import pytest
import tensorflow as tf
import yaml
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
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
        "grpc_target": f"127.0.0.1:{grpc_port}",
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


# TF Serving's canonical code -> HTTP status (model_servers/http_server.cc, ToHTTPStatusCode).
HTTP_STATUS = {
    "OK": 200, "INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "NOT_FOUND": 404,
    "UNIMPLEMENTED": 501, "RESOURCE_EXHAUSTED": 429,
}  # fmt: skip
# Sources of the expected answers (tensorflow/serving, tensorflow_serving/...).
JSON_TENSOR = "util/json_tensor.cc"
REST_HANDLER = "model_servers/http_rest_api_handler.cc"
REST_UTIL = "model_servers/http_rest_api_util.cc"
STATUS_IMPL = "model_servers/get_model_status_impl.cc"
SERVER_CORE = "model_servers/server_core.cc"
PREDICT_UTIL = "servables/tensorflow/predict_util.cc"
CLASSIFIER = "servables/tensorflow/classifier.cc"
REGRESSOR = "servables/tensorflow/regressor.cc"
API_REST_MD = "g3doc/api_rest.md"


class Case(NamedTuple):
    """One request and TF Serving 2.21's answer to it: its canonical status code, and either
    the JSON body (code OK) or the error text. `exact`: the whole message is TF Serving's;
    otherwise the text is a part of it (TF Serving echoes the request there, pretty-printed)."""

    name: str
    method: str
    path: str  # after /v1/models/contract; "@..." is a path after /v1/models/
    body: bytes | dict | None
    code: str
    expected: dict | str | None
    source: str
    exact: bool = True


STATUS_V2 = {
    "version": "2",
    "state": "AVAILABLE",
    "status": {"error_code": "OK", "error_message": ""},
}
STATUS_V1 = {**STATUS_V2, "version": "1"}
BOTH_VERSIONS = {"model_version_status": [STATUS_V2, STATUS_V1]}
ROW = {"instances": [{"x": 1.5, "flag": True}, {"x": 2.0, "flag": False}]}
REST_PARITY = [
    Case("status", "GET", "", None, "OK", BOTH_VERSIONS, STATUS_IMPL),
    Case("status of a version", "GET", "/versions/1", None, "OK",
         {"model_version_status": [STATUS_V1]}, STATUS_IMPL),
    # GetModelStatus reads the spec's version only: a label (known or not) lists every version.
    Case("status of a label lists every version", "GET", "/labels/canary", None, "OK",
         BOTH_VERSIONS, STATUS_IMPL),
    Case("status of an unknown label lists every version", "GET", "/labels/nope", None, "OK",
         BOTH_VERSIONS, STATUS_IMPL),
    Case("row predict, several outputs: an object per instance, _bytes as b64", "POST",
         ":predict", ROW, "OK",
         {"predictions": [
             {"y": 4.5, "id_bytes": _b64(b"\xff\x00true"), "label": "on"},
             {"y": 0.0, "id_bytes": _b64(b"\xff\x00false"), "label": "off"},
         ]}, JSON_TENSOR),
    Case("columnar predict, several outputs: an object of outputs", "POST", ":predict",
         {"inputs": {"x": [1.5, 2.0], "flag": [True, False]}}, "OK",
         {"outputs": {
             "y": [4.5, 0.0],
             "id_bytes": [_b64(b"\xff\x00true"), _b64(b"\xff\x00false")],
             "label": ["on", "off"],
         }}, JSON_TENSOR),
    Case("row predict, one input and output: plain values", "POST", ":predict",
         {"signature_name": "half", "instances": [1.0, 0.2]}, "OK",
         {"predictions": [0.5, 0.1]}, JSON_TENSOR),
    Case("columnar predict, one output: the name is dropped", "POST", ":predict",
         {"signature_name": "half", "inputs": [3.0, 4.0]}, "OK", {"outputs": [1.5, 2.0]},
         JSON_TENSOR),
    Case("unknown top-level keys are ignored", "POST", ":predict",
         {"signature_name": "half", "instances": [1.0], "client": {"id": 7}}, "OK",
         {"predictions": [0.5]}, JSON_TENSOR),
    Case("an integer literal for a float input is rounded to float32", "POST", ":predict",
         {"signature_name": "half", "instances": [16777217, 215]}, "OK",
         {"predictions": [8388608.0, 107.5]}, API_REST_MD),
    Case("the /v1/ prefix and the path are case-insensitive", "POST",
         "@../../V1/MODELS/contract/LABELS/stable:predict",
         {"instances": [{"x": 1.5, "flag": True}]}, "OK",
         {"predictions": [{"y": 3.0, "id_bytes": _b64(b"\xff\x00true"), "label": "on"}]},
         REST_UTIL),
    Case("the method is matched as written: :PREDICT is malformed", "POST", ":PREDICT", ROW,
         "INVALID_ARGUMENT", "Malformed request: POST /v1/models/contract:PREDICT", REST_HANDLER),
    Case("an upper-case METADATA asks for the status", "GET", "/METADATA", None, "OK",
         BOTH_VERSIONS, REST_HANDLER),
    Case("a version", "POST", "/versions/1:predict", ROW, "OK", None, REST_UTIL),
    Case("a label", "POST", "/labels/stable:predict", {"instances": [{"x": 1.5, "flag": True}]},
         "OK", {"predictions": [{"y": 3.0, "id_bytes": _b64(b"\xff\x00true"), "label": "on"}]},
         SERVER_CORE),
    Case("classify", "POST", ":classify", {"signature_name": "classify_x", "examples": [{"x": 0.0}]},
         "OK", {"results": [[["neg", 0.5], ["pos", 0.5]]]}, CLASSIFIER),
    Case("classify with context", "POST", "/labels/stable:classify",
         {"signature_name": "classify_x", "context": {"x": 0.0}, "examples": [{}, {"x": 0.0}]},
         "OK", {"results": [[["neg", 0.5], ["pos", 0.5]], [["neg", 0.5], ["pos", 0.5]]]},
         JSON_TENSOR),
    Case("regress", "POST", ":regress", {"signature_name": "regress_x", "examples": [{"x": 80.0}]},
         "OK", {"results": [240.0]}, REGRESSOR),
    Case("regress a version", "POST", "/versions/1:regress",
         {"signature_name": "regress_x", "examples": [{"x": 80.0}, {"x": 0.5}]}, "OK",
         {"results": [160.0, 1.0]}, REGRESSOR),
    # Errors: TF Serving's status code and message.
    Case("unknown model", "POST", "@other:predict", ROW, "NOT_FOUND",
         "Servable not found for request: Latest(other)", SERVER_CORE),
    Case("unknown version", "POST", "/versions/7:predict", ROW, "NOT_FOUND",
         "Servable not found for request: Specific(contract, 7)", SERVER_CORE),
    Case("unknown label", "POST", "/labels/nope:predict", ROW, "INVALID_ARGUMENT",
         "Unrecognized servable version label: nope", SERVER_CORE),
    Case("metadata of an unknown label", "GET", "/labels/nope/metadata", None,
         "INVALID_ARGUMENT", "Unrecognized servable version label: nope", SERVER_CORE),
    Case("status of an unknown version", "GET", "/versions/7", None, "NOT_FOUND",
         "Could not find version 7 of model contract", STATUS_IMPL),
    Case("status of an unknown model", "GET", "@other", None, "NOT_FOUND",
         "Could not find any versions of model other", STATUS_IMPL),
    Case("status without a model name", "GET", "@../models", None, "INVALID_ARGUMENT",
         "Missing model name in request.", REST_HANDLER),
    Case("version too large", "POST", "/versions/99999999999999999999:predict", ROW,
         "INVALID_ARGUMENT", "Failed to convert version: 99999999999999999999 to numeric.",
         REST_UTIL),
    Case("malformed path", "POST", "/version/1:predict", ROW, "INVALID_ARGUMENT",
         "Malformed request: POST /v1/models/contract/version/1:predict", REST_HANDLER),
    Case("PUT", "PUT", ":predict", ROW, "INVALID_ARGUMENT",
         "Malformed request: PUT /v1/models/contract:predict", REST_HANDLER),
    Case("empty body", "POST", ":predict", b"", "INVALID_ARGUMENT",
         "JSON Parse error: The document is empty", JSON_TENSOR),
    Case("not JSON", "POST", ":predict", b"instances = [1, 2]", "INVALID_ARGUMENT",
         "JSON Parse error: Invalid value. at offset: 0", JSON_TENSOR),
    Case("not an object", "POST", ":predict", b"[1]", "INVALID_ARGUMENT",
         "JSON Value: [1] Is not object", JSON_TENSOR, exact=False),
    Case("signature_name not a string", "POST", ":predict", {"signature_name": 100},
         "INVALID_ARGUMENT", "not formatted correctly. 'signature_name' key must be a string value.",
         JSON_TENSOR, exact=False),
    Case("unknown signature (REST looks it up itself)", "POST", ":predict",
         {"signature_name": "nope", "instances": [1.0]}, "INVALID_ARGUMENT",
         'Serving signature name: "nope" not found in signature def', REST_HANDLER),
    Case("neither key", "POST", ":predict", {"signature_name": "half"}, "INVALID_ARGUMENT",
         "Missing 'inputs' or 'instances' key", JSON_TENSOR),
    Case("both keys", "POST", ":predict", {"instances": [1.0], "inputs": [1.0]},
         "INVALID_ARGUMENT", "Not formatted correctly expecting only one of 'inputs' or "
         "'instances' keys to exist", JSON_TENSOR, exact=False),
    Case("instances not a list", "POST", ":predict", {"instances": {"x": 1.0}},
         "INVALID_ARGUMENT", "Expecting 'instances' to be an list/array", JSON_TENSOR,
         exact=False),
    Case("empty instances", "POST", ":predict", {"instances": []}, "INVALID_ARGUMENT",
         "No values in 'instances' array", JSON_TENSOR, exact=False),
    Case("wrong type", "POST", ":predict", {"signature_name": "half", "instances": ["x", "y"]},
         "INVALID_ARGUMENT", "Failed to process element: 0 of 'instances' list. Error: "
         'INVALID_ARGUMENT: JSON Value: "x" Type: String is not of expected type: float',
         JSON_TENSOR),
    Case("null for a float", "POST", ":predict", {"signature_name": "half", "inputs": [None]},
         "INVALID_ARGUMENT", "JSON Value: null Type: Null is not of expected type: float",
         JSON_TENSOR),
    Case("bool input given a number", "POST", ":predict",
         {"instances": [{"x": 1.0, "flag": 1}]}, "INVALID_ARGUMENT",
         "Failed to process element: 0 key: flag of 'instances' list. Error: INVALID_ARGUMENT: "
         "JSON Value: 1 Type: Number is not of expected type: bool", JSON_TENSOR),
    Case("a decimal beyond float32", "POST", ":predict",
         {"signature_name": "half", "inputs": [1e39]}, "INVALID_ARGUMENT",
         "Cannot convert JSON value: 1e+39 to float without loss of precision.", JSON_TENSOR),
    Case("missing input in an instance", "POST", ":predict", {"instances": [{"x": 1.0}]},
         "INVALID_ARGUMENT", "keys must be equal to: flag,x", JSON_TENSOR, exact=False),
    Case("unknown input in an instance", "POST", ":predict",
         {"instances": [{"x": 1.0, "flag": True, "z": 1}]}, "INVALID_ARGUMENT",
         "Failed to process element: 0 key: z of 'instances' list. Error: INVALID_ARGUMENT: "
         "JSON object: does not have named input: z", JSON_TENSOR),
    Case("plain list for two inputs", "POST", ":predict", {"instances": [1.0]},
         "INVALID_ARGUMENT", "instances is a plain list, but expecting list of objects as "
         "multiple input tensors required as per tensorinfo_map", JSON_TENSOR),
    Case("missing input in columnar", "POST", ":predict", {"inputs": {"x": [1.0]}},
         "INVALID_ARGUMENT", "Missing named input: flag in 'inputs' object.", JSON_TENSOR),
    Case("ragged instance", "POST", ":predict",
         {"signature_name": "half", "instances": [[1.0, 2.0], [1.0]]}, "INVALID_ARGUMENT",
         "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: Expecting "
         "tensor size: 2 but got: 1", JSON_TENSOR),
    # The model's own kernel refuses it; TF Serving passes the session's status on.
    Case("shapes the model cannot combine", "POST", ":predict",
         {"inputs": {"x": [1.0, 2.0], "flag": [True]}}, "INVALID_ARGUMENT", "shapes",
         PREDICT_UTIL, exact=False),
    Case("classify on a predict signature", "POST", ":classify", {"examples": [{"x": 1.0}]},
         "INVALID_ARGUMENT", "Expected classification signature method_name to be "
         "tensorflow/serving/classify. Was: tensorflow/serving/predict", CLASSIFIER),
    Case("classify an unknown signature", "POST", ":classify",
         {"signature_name": "nope", "examples": [{"x": 1.0}]}, "INVALID_ARGUMENT",
         "No signature was found with the name: nope", CLASSIFIER),
    Case("regress on a classification signature", "POST", ":regress",
         {"signature_name": "classify_x", "examples": [{"x": 1.0}]}, "INVALID_ARGUMENT",
         "Expected regression signature method_name to be tensorflow/serving/regress. Was: "
         "tensorflow/serving/classify", REGRESSOR),
    Case("regress without examples", "POST", ":regress", {"signature_name": "regress_x"},
         "INVALID_ARGUMENT", "When method is classify, key 'examples' is expected and was not "
         "found", JSON_TENSOR, exact=False),
    Case("an example that is not an object", "POST", ":regress",
         {"signature_name": "regress_x", "examples": [1]}, "INVALID_ARGUMENT",
         "Example must be JSON object but got JSON Number", JSON_TENSOR),
    Case("a feature of two kinds", "POST", ":regress",
         {"signature_name": "regress_x", "examples": [{"x": [1.0, "a"]}]}, "INVALID_ARGUMENT",
         "Unexpected element type in feature: x expecting type: float", JSON_TENSOR),
]  # fmt: skip


def _url(api, path: str) -> str:
    # "@other..." addresses another model name; every other path is under /v1/models/contract.
    if path.startswith("@../../"):
        return api["root"] + "/" + path[len("@../../") :]
    if path.startswith("@../"):
        return api["root"] + "/v1/" + path[len("@../") :]
    return api["root"] + "/v1/models/" + path[1:] if path.startswith("@") else api["base"] + path


@pytest.mark.parametrize("case", REST_PARITY, ids=[c.name for c in REST_PARITY])
def test_rest_answers_as_tf_serving_2_21(api, case):
    assert case.source, case  # every expected answer names the TF Serving source it comes from
    code, raw, headers = _request(_url(api, case.path), case.body, method=case.method)
    assert code == HTTP_STATUS[case.code], raw[:2000]
    assert headers.get("content-type", "").startswith("application/json")
    reply = json.loads(raw)
    if case.code != "OK":
        assert set(reply) == {"error"}, reply
        if case.exact:
            assert reply["error"] == case.expected
        else:
            assert case.expected in reply["error"], reply
    elif case.expected is not None:
        # Exact equality: TF Serving writes float32 values as their shortest decimals.
        assert reply == case.expected


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
    from google.protobuf import json_format

    code, raw, _ = _request(api["base"] + "/versions/1/metadata")
    assert code == 200, raw
    reply = json.loads(raw)
    assert reply["model_spec"] == {"name": MODEL, "signature_name": "", "version": "1"}
    # As TF Serving writes it (http_rest_api_util.cc): the SignatureDefMap unpacked from its
    # Any, so it parses strictly (unknown fields refused) into the proto.
    signature_map = json_format.ParseDict(
        reply["metadata"]["signature_def"], get_model_metadata_pb2.SignatureDefMap()
    )
    signatures = reply["metadata"]["signature_def"]["signature_def"]
    assert (
        set(signatures)
        == set(signature_map.signature_def)
        == {
            "serving_default",
            "half",
            "regress_x",
            "classify_x",
            "dtypes",
            "__saved_model_init_op",
        }
    )
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
    assert signature_map.signature_def["half"].inputs["x"].name == "half_x:0"


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


PREDICT_IMPL = "servables/tensorflow/predict_impl.cc"
SAVED_MODEL_UTIL = "tensorflow/cc/saved_model/util.cc (TensorFlow)"
METADATA_IMPL = "servables/tensorflow/get_model_metadata_impl.cc"
CLASSIFICATION_SERVICE = "servables/tensorflow/classification_service.cc"
REGRESSION_SERVICE = "servables/tensorflow/regression_service.cc"
MULTI_INFERENCE = "servables/tensorflow/multi_inference.cc"
MODEL_SERVICE = "model_servers/model_service_impl.cc"


def _predict(**spec):
    """A Predict request of serving_default: x and flag, unless `inputs` says otherwise."""
    request = predict_pb2.PredictRequest()
    if not spec.pop("no_spec", False):
        request.model_spec.SetInParent()
        request.model_spec.name = spec.pop("name", MODEL)
        if "version" in spec:
            request.model_spec.version.value = spec.pop("version")
        if "label" in spec:
            request.model_spec.version_label = spec.pop("label")
        request.model_spec.signature_name = spec.pop("signature", "")
    inputs = spec.pop("inputs", {"x": np.array([1.0], np.float32), "flag": np.array([True])})
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    request.output_filter.extend(spec.pop("output_filter", []))
    assert not spec, spec
    return request


def _examples_request(message, *, signature: str, spec: bool = True):
    request = message()
    if spec:
        request.model_spec.name = MODEL
        request.model_spec.signature_name = signature
    request.input.example_list.examples.add().features.feature["x"].float_list.value.append(1.0)
    return request


def _multi(*tasks, model_names=None):
    request = inference_pb2.MultiInferenceRequest()
    for index, (signature, method) in enumerate(tasks):
        task = request.tasks.add()
        task.model_spec.name = (model_names or [MODEL] * len(tasks))[index]
        task.model_spec.signature_name = signature
        task.method_name = method
    request.input.example_list.examples.add().features.feature["x"].float_list.value.append(1.0)
    return request


def _metadata(*fields, spec: bool = True):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    if spec:
        request.model_spec.name = MODEL
    request.metadata_field.extend(fields)
    return request


def _reload(text: str):
    from google.protobuf import text_format
    from tensorflow_serving.apis import model_management_pb2

    request = model_management_pb2.ReloadConfigRequest()
    text_format.Parse(text, request.config)
    return request


def _contract_config(extra: str = "", *, name: str = MODEL, platform: str = "tensorflow") -> str:
    platform_line = f'model_platform: "{platform}"' if platform else ""
    return (
        f'model_config_list {{ config {{ name: "{name}" {platform_line} '
        f"model_version_policy {{ latest {{ num_versions: 2 }} }} "
        'version_labels { key: "stable" value: 1 } version_labels { key: "canary" value: 2 } '
        f"}} {extra} }}"
    )


CLASSIFY, REGRESS = "tensorflow/serving/classify", "tensorflow/serving/regress"
PREDICT = "tensorflow/serving/predict"
# (name, service, method, request, TF Serving's code, its message, source)
GRPC_PARITY = [
    ("unknown model", "predictions", "Predict", lambda: _predict(name="other"), "NOT_FOUND",
     "Servable not found for request: Latest(other)", SERVER_CORE),
    ("unknown version", "predictions", "Predict", lambda: _predict(version=7), "NOT_FOUND",
     "Servable not found for request: Specific(contract, 7)", SERVER_CORE),
    ("unknown label", "predictions", "Predict", lambda: _predict(label="nope"),
     "INVALID_ARGUMENT", "Unrecognized servable version label: nope", SERVER_CORE),
    ("unknown signature", "predictions", "Predict", lambda: _predict(signature="nope"),
     "FAILED_PRECONDITION", 'Serving signature key "nope" not found.', PREDICT_UTIL),
    ("no model_spec", "predictions", "Predict", lambda: _predict(no_spec=True),
     "INVALID_ARGUMENT", "Missing ModelSpec", PREDICT_IMPL),
    ("an empty model_spec", "predictions", "Predict", lambda: _predict(name=""),
     "INVALID_ARGUMENT", "ModelSpec has no name specified.", SERVER_CORE),
    ("wrong dtype", "predictions", "Predict",
     lambda: _predict(inputs={"x": np.array(["a"]), "flag": np.array([True])}),
     "INVALID_ARGUMENT", "Expects arg[x] to be float but string is provided", PREDICT_UTIL),
    ("missing input", "predictions", "Predict",
     lambda: _predict(inputs={"x": np.array([1.0], np.float32)}), "INVALID_ARGUMENT",
     "input size does not match signature: 1!=2 len({x}) != len({flag,x}). Sent extra: {}. "
     "Missing but required: {flag}.", PREDICT_UTIL),
    ("an input under another name", "predictions", "Predict",
     lambda: _predict(inputs={"x": np.array([1.0], np.float32), "flog": np.array([True])}),
     "INVALID_ARGUMENT", "Signature input alias: flag(feed name: serving_default_flag:0) not "
     "found in request and no default value provided. Inputs expected to be in the request "
     "{flog,x}, or default input alias set: ", SAVED_MODEL_UTIL),
    ("unknown output in output_filter", "predictions", "Predict",
     lambda: _predict(output_filter=["z"]), "INVALID_ARGUMENT",
     "output tensor alias not found in signature: z Outputs expected to be in the set "
     "{id_bytes,label,y}.", PREDICT_UTIL),
    ("an output named twice in output_filter", "predictions", "Predict",
     lambda: _predict(output_filter=["y", "y"]), "INVALID_ARGUMENT",
     "duplicate output tensor alias: y", PREDICT_UTIL),
    ("classify without model_spec", "predictions", "Classify",
     lambda: _examples_request(classification_pb2.ClassificationRequest, signature="", spec=False),
     "INVALID_ARGUMENT", "Missing ModelSpec", CLASSIFICATION_SERVICE),
    ("regress without model_spec", "predictions", "Regress",
     lambda: _examples_request(regression_pb2.RegressionRequest, signature="", spec=False),
     "INVALID_ARGUMENT", "Missing ModelSpec", REGRESSION_SERVICE),
    ("regress a predict signature", "predictions", "Regress",
     lambda: _examples_request(regression_pb2.RegressionRequest, signature="half"),
     "INVALID_ARGUMENT", "Expected regression signature method_name to be "
     "tensorflow/serving/regress. Was: tensorflow/serving/predict", REGRESSOR),
    ("metadata without model_spec", "predictions", "GetModelMetadata",
     lambda: _metadata("signature_def", spec=False), "INVALID_ARGUMENT", "Missing ModelSpec",
     METADATA_IMPL),
    ("metadata without a field", "predictions", "GetModelMetadata", lambda: _metadata(),
     "INVALID_ARGUMENT", "GetModelMetadataRequest must specify at least one metadata_field",
     METADATA_IMPL),
    ("metadata of an unknown field", "predictions", "GetModelMetadata",
     lambda: _metadata("graph"), "INVALID_ARGUMENT", "Metadata field graph is not supported",
     METADATA_IMPL),
    ("status without model_spec", "models", "GetModelStatus",
     lambda: get_model_status_pb2.GetModelStatusRequest(), "INVALID_ARGUMENT",
     "Missing ModelSpec", STATUS_IMPL),
    ("multi-inference without tasks", "predictions", "MultiInference", lambda: _multi(),
     "INVALID_ARGUMENT", "ModelSpec has no name specified.", SERVER_CORE),
    ("multi-inference on two models", "predictions", "MultiInference",
     lambda: _multi(("classify_x", CLASSIFY), ("regress_x", REGRESS),
                    model_names=[MODEL, "other"]),
     "INVALID_ARGUMENT", "All ModelSpecs in a MultiInferenceRequest must access the same model "
     "name.", MULTI_INFERENCE),
    ("multi-inference naming a signature twice", "predictions", "MultiInference",
     lambda: _multi(("classify_x", CLASSIFY), ("classify_x", CLASSIFY)), "INVALID_ARGUMENT",
     "Duplicate evaluation of signature: classify_x", MULTI_INFERENCE),
    ("multi-inference on a model without that signature", "predictions", "MultiInference",
     lambda: _multi(("classify_x", CLASSIFY), ("regression", REGRESS)), "INVALID_ARGUMENT",
     "Requested signature not found in model graph: regression", MULTI_INFERENCE),
    ("multi-inference with a predict task", "predictions", "MultiInference",
     lambda: _multi(("half", PREDICT)), "UNIMPLEMENTED",
     "Unsupported signature method_name: tensorflow/serving/predict", MULTI_INFERENCE),
    ("multi-inference regressing a predict signature", "predictions", "MultiInference",
     lambda: _multi(("half", REGRESS)), "INVALID_ARGUMENT",
     "Expected regression signature method_name to be tensorflow/serving/regress. Was: "
     "tensorflow/serving/predict", REGRESSOR),
    ("reload a config that is not a model list", "models", "HandleReloadConfigRequest",
     lambda: _reload("custom_model_config { }"), "INVALID_ARGUMENT",
     "ServerModelConfig type not supported by HandleReloadConfigRequest. Only ModelConfigList "
     "is currently supported", MODEL_SERVICE),
    ("reload a config listing the model twice", "models", "HandleReloadConfigRequest",
     lambda: _reload(_contract_config(f'config {{ name: "{MODEL}" model_platform: "tensorflow" }}')),
     "INVALID_ARGUMENT", f"Illegal to list model {MODEL} multiple times in config list",
     SERVER_CORE),
    ("reload a config without a platform", "models", "HandleReloadConfigRequest",
     lambda: _reload(_contract_config(platform="")), "INVALID_ARGUMENT",
     "Illegal setting neither ModelServerConfig::model_type (deprecated) nor "
     "ModelServerConfig::model_platform.", SERVER_CORE),
    ("reload a config with another platform", "models", "HandleReloadConfigRequest",
     lambda: _reload(_contract_config(platform="pytorch")), "INVALID_ARGUMENT",
     f"Model {MODEL} requests unsupported platform pytorch", SERVER_CORE),
    ("reload a config labelling a version that is not there", "models",
     "HandleReloadConfigRequest",
     lambda: _reload(_contract_config().replace("value: 2 }", "value: 9 }")),
     "FAILED_PRECONDITION", f"Request to assign label to version 9 of model {MODEL}, which is "
     "not currently available for inference", SERVER_CORE),
]  # fmt: skip


@pytest.mark.parametrize("case", GRPC_PARITY, ids=[c[0] for c in GRPC_PARITY])
def test_grpc_answers_as_tf_serving_2_21(api, case):
    _, service, method, make, code, message, source = case
    assert source
    with pytest.raises(grpc.RpcError) as raised:
        getattr(api[service], method)(make(), timeout=60)
    assert raised.value.code() == grpc.StatusCode[code]
    assert raised.value.details() == message
    _still_serving(api)


# The TensorProto field TensorFlow's AsProtoField fills per dtype (tensorflow/core/framework/
# tensor.cc, ProtoHelper), which TF Serving's Predict answers carry (predict_util.cc).
TYPED_FIELDS = {
    "f32": ("DT_FLOAT", "float_val"), "f64": ("DT_DOUBLE", "double_val"),
    "f16": ("DT_HALF", "half_val"), "bf16": ("DT_BFLOAT16", "half_val"),
    "i8": ("DT_INT8", "int_val"), "i32": ("DT_INT32", "int_val"), "u8": ("DT_UINT8", "int_val"),
    "i64": ("DT_INT64", "int64_val"), "u32": ("DT_UINT32", "uint32_val"),
    "u64": ("DT_UINT64", "uint64_val"), "flag": ("DT_BOOL", "bool_val"),
    "text": ("DT_STRING", "string_val"), "pair": ("DT_FLOAT", "float_val"),
}  # fmt: skip


def test_grpc_outputs_are_in_the_typed_field_of_their_dtype(api):
    from tensorflow.core.framework import types_pb2

    xs = [1.0, 2.0, 3.0]
    request = _predict(signature="dtypes", inputs={"x": np.array(xs, np.float32)})
    response = api["predictions"].Predict(request, timeout=60)
    assert set(response.outputs) == set(TYPED_FIELDS)
    for name, (dtype, field) in TYPED_FIELDS.items():
        proto = response.outputs[name]
        assert types_pb2.DataType.Name(proto.dtype) == dtype, name
        assert proto.tensor_content == b"", name  # never the packed bytes
        shape = [d.size for d in proto.tensor_shape.dim]
        assert shape == ([3, 2] if name == "pair" else [3]), name
        values = list(getattr(proto, field))
        assert len(values) == int(np.prod(shape)), name
        # And the values read back as TensorFlow reads the proto.
        np.testing.assert_array_equal(
            tf.make_ndarray(proto),
            np.array(
                [[x, -x] for x in xs]
                if name == "pair"
                else [str(x).encode() for x in ("1.000000", "2.000000", "3.000000")]
                if name == "text"
                else [x > 0 for x in xs]
                if name == "flag"
                else xs
            ).astype(tf.make_ndarray(proto).dtype),
        )
    assert list(response.outputs["f32"].float_val) == xs
    assert list(response.outputs["text"].string_val) == [b"1.000000", b"2.000000", b"3.000000"]
    # half_val holds the 16 bits of each value.
    assert list(response.outputs["f16"].half_val) == [
        int(v) for v in np.array(xs, np.float16).view(np.uint16)
    ]


def test_multi_inference_runs_classification_and_regression_over_one_input(api):
    xs = [0.5, -1.0]
    request = _multi(("classify_x", CLASSIFY), ("regress_x", REGRESS))
    del request.input.example_list.examples[:]
    for x in xs:
        request.input.example_list.examples.add().features.feature["x"].float_list.value.append(x)
    response = api["predictions"].MultiInference(request, timeout=60)
    classified, regressed = response.results
    assert classified.model_spec.signature_name == "classify_x"
    assert regressed.model_spec.signature_name == "regress_x"
    assert classified.model_spec.version.value == 2 == regressed.model_spec.version.value
    alone = _spec(classification_pb2.ClassificationRequest(), signature="classify_x")
    alone.input.CopyFrom(request.input)
    assert classified.classification_result == api["predictions"].Classify(alone).result
    assert [r.value for r in regressed.regression_result.regressions] == [x * SCALES[2] for x in xs]


def test_reload_config_applies_versions_and_labels_without_a_restart(api):
    """HandleReloadConfigRequest: a new models.config (version policy, labels) applies at once;
    an unloaded version stays in the status as END; the original config comes back."""
    models = api["models"]
    status_request = _spec(get_model_status_pb2.GetModelStatusRequest(), label="stable")

    def states():
        status = models.GetModelStatus(status_request, timeout=30)
        state = get_model_status_pb2.ModelVersionStatus.State
        return {s.version: state.Name(s.state) for s in status.model_version_status}

    only_one = _reload(
        f'model_config_list {{ config {{ name: "{MODEL}" model_platform: "tensorflow" '
        "model_version_policy { specific { versions: 1 } } "
        'version_labels { key: "stable" value: 1 } version_labels { key: "old" value: 1 } } }'
    )
    try:
        answer = models.HandleReloadConfigRequest(only_one, timeout=120)
        assert answer.status.error_code == 0 and answer.status.error_message == ""
        assert states() == {1: "AVAILABLE", 2: "END"}  # a label in the request is not looked at
        code, raw, _ = _request(
            f"{api['base']}/labels/old:predict", {"instances": [{"x": 1.0, "flag": True}]}
        )
        assert code == 200 and json.loads(raw)["predictions"][0]["y"] == SCALES[1], raw
        code, raw, _ = _request(f"{api['base']}/labels/canary:predict", ROW)
        assert (
            code == 400
            and json.loads(raw)["error"] == "Unrecognized servable version label: canary"
        )
        code, raw, _ = _request(f"{api['base']}/versions/2:predict", ROW)
        assert code == 404, raw
    finally:
        models.HandleReloadConfigRequest(_reload(_contract_config()), timeout=120)
    assert states() == {1: "AVAILABLE", 2: "AVAILABLE"}
    code, raw, _ = _request(
        f"{api['base']}/labels/canary:predict", {"instances": [{"x": 1.0, "flag": True}]}
    )
    assert code == 200 and json.loads(raw)["predictions"][0]["y"] == SCALES[2], raw


def test_grpc_takes_messages_over_4_mib(api):
    """TF Serving's gRPC limit is 2 GiB - 1 (server.cc SetMaxMessageSize(kint32max)): a 9 MB
    batch is answered, request and answer alike."""
    xs = np.arange(2_250_000, dtype=np.float32)  # 9 MB of float32
    request = _predict(signature="half", inputs={"x": xs})
    assert request.ByteSize() > 9_000_000
    # The client's own limit is gRPC's 4 MiB default: a client of TF Serving raises it as well.
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(api["grpc_target"], options=options) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(request, timeout=120)
    np.testing.assert_array_equal(np.array(response.outputs["y"].float_val, np.float32), xs / 2)


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
