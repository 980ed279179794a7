"""`fullthrottle predict`: send CSV rows or JSON to a model server and print the predictions.

CSV rows become tf.Examples typed by the config's data spec (missing cells left out, as
CsvExampleGen does), sent to ``serving_default``; JSON is either a whole TF Serving request body
or a list of feature objects (sent to ``predict_raw``). REST works with `fullthrottle serve` and
TF Serving; ``--grpc`` uses TF Serving's PredictionService through tensorflow-serving-api.
"""

from __future__ import annotations

import argparse
import base64
import csv
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from fullthrottle.commands.run import add_config_arguments, config_from_args
from fullthrottle.commands.serve import ServingError
from fullthrottle.config import Config, _check_name
from fullthrottle.errors import DataError


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "predict",
        help="send CSV rows or JSON to a model server and print predictions",
        description=(
            "Reads CSV (header row; the label column is ignored) or JSON, sends it to a TF Serving "
            "REST API (fullthrottle serve, TF Serving, KServe) or TF Serving's gRPC API, and prints "
            "one line per example: the class and the class probabilities."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle predict --csv new_penguins.csv\n"
            "  fullthrottle predict --json request.json --url http://127.0.0.1:8501\n"
            "  fullthrottle predict --csv rows.csv --grpc 127.0.0.1:8500 --output json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--csv", metavar="FILE", help="CSV file with a header row ('-' reads stdin)"
    )
    source.add_argument(
        "--json", metavar="FILE", help="a request body or a list of feature objects ('-': stdin)"
    )
    parser.add_argument(
        "--url", help="REST base URL (default: http://<serving.host>:<serving.rest_port>)"
    )
    parser.add_argument(
        "--grpc", metavar="HOST:PORT", help="use TF Serving's gRPC API at HOST:PORT instead of REST"
    )
    parser.add_argument("--model-name", help="default: the config's model_name")
    parser.add_argument("--version", type=int, help="ask for one version (default: the newest)")
    parser.add_argument("--output", choices=("text", "json"), default="text")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    return parser


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    file = Path(path)
    if not file.is_file():
        raise DataError(f"{path} does not exist or is not a file")
    return file.read_text(encoding="utf-8")


def csv_to_examples(text: str, config: Config, *, source: str) -> list[bytes]:
    """Serialized tf.Examples for CSV rows, typed by the data spec; missing cells are left out."""
    import tensorflow as tf

    spec = config.data
    reader = csv.DictReader(text.splitlines())
    columns = set(reader.fieldnames or [])
    missing = [c for c in spec.feature_columns if c not in columns]
    if missing:
        raise DataError(
            f"{source}: the CSV header lacks the feature column(s) {missing}; it has {sorted(columns)}"
        )
    numeric = set(spec.numeric)
    examples = []
    for line, row in enumerate(reader, start=2):
        features = {}
        for name in spec.feature_columns:
            cell = (row.get(name) or "").strip()
            if cell == "" or cell in spec.na_values:
                continue
            if name in numeric:
                try:
                    features[name] = tf.train.Feature(
                        float_list=tf.train.FloatList(value=[float(cell)])
                    )
                except ValueError:
                    raise DataError(
                        f"{source}, line {line}: column {name!r} is numeric, got {cell!r}"
                    ) from None
            else:
                features[name] = tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[cell.encode("utf-8")])
                )
        examples.append(
            tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
        )
    if not examples:
        raise DataError(f"{source}: no data rows after the header")
    return examples


def request_body(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    """The TF Serving REST body for the input given on the command line."""
    if args.csv:
        examples = csv_to_examples(_read(args.csv), config, source=args.csv)
        return {
            "signature_name": "serving_default",
            "instances": [{"b64": base64.b64encode(e).decode()} for e in examples],
        }
    try:
        data = json.loads(_read(args.json))
    except json.JSONDecodeError as exc:
        raise DataError(f"{args.json} is not valid JSON: {exc}") from None
    if isinstance(data, list):
        return {"signature_name": "predict_raw", "instances": data}
    if isinstance(data, dict):
        return data
    raise DataError(
        f"{args.json} must hold a request body (an object) or a list of feature objects"
    )


def predict_rest(url: str, body: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")
        try:
            detail = json.loads(detail).get("error", detail)
        except (json.JSONDecodeError, AttributeError):
            pass
        raise ServingError(f"the server at {url} answered {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServingError(
            f"cannot reach {url}: {reason}; is `fullthrottle serve` (or TF Serving) running there?"
        ) from None


def predict_grpc(
    target: str, body: dict[str, Any], *, model_name: str, version: int | None, timeout: float
) -> dict[str, Any]:
    """TF Serving's gRPC Predict for the `serving_default` examples body (CSV input)."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    if body.get("signature_name") != "serving_default" or "instances" not in body:
        raise ServingError(
            "--grpc sends CSV rows (serving_default); use REST for JSON feature objects"
        )
    examples = [base64.b64decode(i["b64"]) for i in body["instances"]]
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = "serving_default"
    if version is not None:
        request.model_spec.version.value = version
    request.inputs["examples"].CopyFrom(tf.make_tensor_proto(examples, dtype=tf.string))
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        try:
            response = stub.Predict(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise ServingError(
                f"gRPC Predict at {target} failed: {exc.code().name}: {exc.details()}"
            ) from None
    outputs = {name: tf.make_ndarray(proto) for name, proto in response.outputs.items()}
    probabilities = outputs["probabilities"].tolist()
    classes = [c.decode() for c in outputs["classes"].tolist()]
    return {
        "predictions": [
            {"classes": c, "probabilities": p} for c, p in zip(classes, probabilities, strict=True)
        ]
    }


def _rows(response: dict[str, Any]) -> list[dict[str, Any]]:
    if "predictions" in response:
        return list(response["predictions"])
    outputs = response.get("outputs") or {}
    classes, probabilities = outputs.get("classes", []), outputs.get("probabilities", [])
    return [{"classes": c, "probabilities": p} for c, p in zip(classes, probabilities, strict=True)]


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    model_name = args.model_name or config.model_name
    _check_name(model_name, "--model-name")
    body = request_body(args, config)
    if args.grpc:
        response = predict_grpc(
            args.grpc, body, model_name=model_name, version=args.version, timeout=args.timeout
        )
    else:
        base = (args.url or f"http://{config.serving.host}:{config.serving.rest_port}").rstrip("/")
        path = (
            f"/v1/models/{model_name}"
            + (f"/versions/{args.version}" if args.version is not None else "")
            + ":predict"
        )
        response = predict_rest(base + path, body, timeout=args.timeout)
    rows = _rows(response)
    if args.output == "json":
        print(json.dumps(rows))
    else:
        for row in rows:
            probabilities = " ".join(f"{p:.4f}" for p in row.get("probabilities", []))
            print(f"{row.get('classes')}\t{probabilities}")
    return 0
