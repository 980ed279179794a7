"""`fullthrottle serve` (KServe model server, TF Serving REST API) and `fullthrottle predict`.

One server process on a random 127.0.0.1 port serves a copy of the pipeline's push folder; the
hot-swap test comes last because it pushes a new version into that folder.
"""

from __future__ import annotations

import base64
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
from serving.server import is_complete
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
    serving_dir = tmp_path_factory.mktemp("served") / "penguins"
    shutil.copytree(Path(last["pushed_model_dir"]).parent, serving_dir)
    port = free_port()
    # A small request limit so the over-size case needs no megabytes; 0.2 s polling for the swap.
    process = start_server(
        str(serving_dir),
        model_name="penguins",
        port=port,
        overrides=("serving.max_request_bytes=200000", "serving.poll_seconds=0.2"),
    )
    yield {
        "base": f"http://127.0.0.1:{port}/v1/models/penguins",
        "dir": serving_dir,
        "last": last,
        "port": port,
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
    if isinstance(value, bytes):
        return value.decode()
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and value != value else value


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
    "missing key": (lambda i: {"signature_name": "predict_raw"}, 400, "exactly one of"),
    "both keys": (lambda i: {"instances": [i], "inputs": {}}, 400, "both"),
    "wrong type": (
        lambda i: {"signature_name": "predict_raw", "instances": [{**i, "bill_length_mm": "long"}]},
        400,
        "takes a number",
    ),
    "wrong shape": (
        lambda i: {
            "signature_name": "predict_raw",
            "instances": [{**i, "island": ["Biscoe", "Dream"]}],
        },
        400,
        "wrong shape",
    ),
    "unknown feature": (
        lambda i: {"signature_name": "predict_raw", "instances": [{**i, "wings": 2}]},
        400,
        "unknown feature",
    ),
    "missing feature": (
        lambda i: {
            "signature_name": "predict_raw",
            "instances": [{k: v for k, v in i.items() if k != "sex"}],
        },
        400,
        "missing feature",
    ),
    "empty instances": (lambda i: {"instances": []}, 400, "empty"),
    "unknown signature": (
        lambda i: {"signature_name": "nope", "instances": [i]},
        400,
        "signature_name",
    ),
    "non-JSON body": (lambda i: b"{not json", 400, "request format"),
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
    assert message.lower() in reply["error"].lower(), reply
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
    assert sorted(signatures) == ["predict_raw", "serving_default"]
    examples = signatures["serving_default"]["inputs"]["examples"]
    assert examples["dtype"] == "DT_STRING"
    assert examples["tensor_shape"]["dim"] == [{"size": "-1", "name": ""}]
    probabilities = signatures["serving_default"]["outputs"]["probabilities"]
    assert probabilities["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in probabilities["tensor_shape"]["dim"]] == ["-1", "3"]
    raw = signatures["predict_raw"]["inputs"]
    assert raw["body_mass_g"]["dtype"] == "DT_INT64" and raw["island"]["dtype"] == "DT_STRING"
    assert _get(f"{served['base']}/versions/{version}/metadata") == (status, reply)
    assert _get(f"{served['base']}/versions/7/metadata")[0] == 404


def test_int64_raw_input_takes_integral_floats_only(served):
    instance = {**_one_raw_instance(served), "body_mass_g": 3750}
    url = served["base"] + ":predict"
    status, as_int, _ = _post(url, {"signature_name": "predict_raw", "instances": [instance]})
    assert status == 200, as_int
    as_float = {**instance, "body_mass_g": 3750.0}
    status, reply, _ = _post(url, {"signature_name": "predict_raw", "instances": [as_float]})
    assert status == 200 and reply == as_int, reply
    fraction = {**instance, "body_mass_g": 3750.5}
    status, reply, _ = _post(url, {"signature_name": "predict_raw", "instances": [fraction]})
    assert status == 400 and "'body_mass_g'" in reply["error"], reply


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
