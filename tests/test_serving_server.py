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

from serving.bench import free_port, start_server, stop_server
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


@pytest.mark.xfail(
    strict=True,
    reason="known bug, measured here: CSV numbers are sent as float_list but the model's raw schema "
    "has int64 columns (body_mass_g), so the server refuses the tf.Examples",
)
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


@pytest.mark.xfail(
    strict=True,
    reason="known bug, measured here: client requests time out (60 s) while a new version is "
    "pushed and loaded; cause not found yet",
)
def test_new_version_is_picked_up_without_a_failed_request(served):
    serving_dir = served["dir"]
    old = max(version_dirs(serving_dir))
    instance = _one_raw_instance(served)
    body = {"signature_name": "predict_raw", "instances": [instance]}
    answered: list[int] = []
    failures: list[str] = []
    incomplete: list[str] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            status, reply, headers = _post(served["base"] + ":predict", body)
            if status != 200:
                failures.append(f"{status} {reply}")
            else:
                answered.append(int(headers["x-fullthrottle-model-version"]))

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
    # Once switched, never back: the switch is one assignment.
    first_new = answered.index(new)
    assert set(answered[first_new:]) == {new}
