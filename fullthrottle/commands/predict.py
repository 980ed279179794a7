"""`fullthrottle predict`: send CSV or Parquet rows or JSON to a model server, print the predictions.

CSV rows become tf.Examples sent to ``serving_default``. Each cell is typed as the model declares
its raw input (``predict_raw``'s dtypes, read from the server's metadata route
``GET /v1/models/<name>/metadata`` or gRPC ``GetModelMetadata``, both TF Serving's): int64
inputs get int64 values (``3750`` and ``3750.0`` are 3750; ``3750.5`` is refused naming the line
and column), float inputs floats, strings bytes. A server without that route (or a model without
``predict_raw``) gets cells typed by the config's data spec, numbers as floats, with a note.
Missing cells (empty or ``data.na_values``) are left out of the tf.Example, as CsvExampleGen does;
if the model requires that feature, the server's refusal is reported with the CSV line.
Parquet rows (``--parquet``, a file or a folder of files, fullthrottle/core/parquet.py) are
typed the same way from their values; a null (NaN, "") is left out like an empty CSV cell.
JSON is either a whole TF Serving request body or a list of feature objects (sent to
``predict_raw``). REST works with `fullthrottle serve` and TF Serving; ``--grpc`` uses TF
Serving's PredictionService through tensorflow-serving-api.

The text output names each probability's class: the class names, in the order of the
probabilities, come from the model's ``classification`` signature (every class name), asked
once with the first example. A regression model's answer is one number per line.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import json
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fullthrottle.commands.options import add_config_arguments, config_from_args
from fullthrottle.core import exit_status
from fullthrottle.core.config import Config, check_name
from fullthrottle.core.errors import DataError, ServingError


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "predict",
        help="send CSV or Parquet rows or JSON to a model server and print predictions",
        description=(
            "Reads CSV (header row; the label column is ignored), Parquet or JSON, sends it to a TF Serving "
            "REST API (fullthrottle serve, TF Serving, KServe) or TF Serving's gRPC API, and prints "
            "one line per example: the class and the class probabilities (a regression model: the "
            "number)."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle predict --csv new_penguins.csv\n"
            "  fullthrottle predict --parquet new_penguins.parquet --output json\n"
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
        "--parquet", metavar="PATH", help="a Parquet file or a folder of Parquet files"
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
        from fullthrottle.core.paths import missing_path_message

        raise DataError(missing_path_message(path, "input file", " or is not a file"))
    return file.read_text(encoding="utf-8")


# TF Serving's dtype names (DataType enum) -> the tf.Example list a value of that dtype goes in.
_EXAMPLE_KIND = {
    "DT_INT64": "int",
    "DT_INT32": "int",
    "DT_INT16": "int",
    "DT_INT8": "int",
    "DT_UINT8": "int",
    "DT_FLOAT": "float",
    "DT_DOUBLE": "float",
    "DT_HALF": "float",
    "DT_BFLOAT16": "float",
    "DT_STRING": "bytes",
}


def raw_input_kinds(metadata: Mapping[str, Any]) -> dict[str, str] | None:
    """Feature -> "int" / "float" / "bytes" from a TF Serving metadata reply's `predict_raw`.

    None when the reply has no `predict_raw` signature (a model not exported by fullthrottle).
    """
    try:
        signature_defs = metadata["metadata"]["signature_def"]["signature_def"]
    except (KeyError, TypeError):
        return None
    raw = signature_defs.get("predict_raw") if isinstance(signature_defs, dict) else None
    if not raw:
        return None
    kinds = {}
    for name, tensor in raw.get("inputs", {}).items():
        dtype = tensor.get("dtype", "")
        if dtype not in _EXAMPLE_KIND:
            raise ServingError(
                f"the model's raw input {name!r} has dtype {dtype}, which a CSV cell cannot fill"
            )
        kinds[name] = _EXAMPLE_KIND[dtype]
    return kinds


def _cell_feature(
    cell: str, kind: str, *, where: str, name: str, decimal: str = ".", thousands: str | None = None
) -> Any:
    """One CSV cell as a tf.train.Feature of the kind the model takes; DataError if it cannot be.

    Numbers are read as training read them (`data.decimal`, `data.thousands`)."""
    import tensorflow as tf

    from fullthrottle.core.data_checks import normalize_number

    if kind == "bytes":
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[cell.encode("utf-8")]))
    plain = normalize_number(cell, decimal=decimal, thousands=thousands)
    if plain is None:
        raise DataError(f"{where}: column {name!r} is numeric, got {cell!r}")
    number = float(plain)
    if kind == "float":
        return tf.train.Feature(float_list=tf.train.FloatList(value=[number]))
    if not number.is_integer():  # also refuses inf and nan
        raise DataError(
            f"{where}: column {name!r} takes whole numbers (the model's input is an integer), "
            f"got {cell!r}; fix the cell or leave it empty if it is unknown"
        )
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(number)]))


def csv_to_examples(
    text: str, config: Config, *, source: str, kinds: Mapping[str, str] | None = None
) -> tuple[list[bytes], list[int]]:
    """Serialized tf.Examples for CSV rows, and the CSV line number of each.

    `kinds` (feature -> "int" / "float" / "bytes", from the model's metadata) decides the
    features and their types; without it the config's data spec does (numbers as floats).
    Missing cells (empty or `data.na_values`) are left out of the example.
    """
    import tensorflow as tf

    spec = config.data
    if kinds is None:
        numeric = set(spec.numeric)
        kinds = {name: "float" if name in numeric else "bytes" for name in spec.feature_columns}
    reader = csv.DictReader(text.splitlines())
    # Header names as staging reads them for training: surrounding whitespace is not part of a
    # name ("a, b" names columns "a" and "b").
    reader.fieldnames = [name.strip() for name in reader.fieldnames or []]
    columns = set(reader.fieldnames)
    missing = [c for c in kinds if c not in columns]
    if missing:
        raise DataError(
            f"{source}: the CSV header lacks the feature column(s) {missing} the model takes; "
            f"it has {sorted(columns)}"
        )
    examples, lines = [], []
    for row in reader:
        line = reader.line_num
        features = {}
        for name, kind in kinds.items():
            cell = (row.get(name) or "").strip()
            if cell == "" or cell in spec.na_values:
                continue
            features[name] = _cell_feature(
                cell,
                kind,
                where=f"{source}, line {line}",
                name=name,
                decimal=spec.decimal,
                thousands=spec.thousands,
            )
        examples.append(
            tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
        )
        lines.append(line)
    if not examples:
        raise DataError(f"{source}: no data rows after the header")
    return examples, lines


def parquet_to_examples(
    path: str, config: Config, *, kinds: Mapping[str, str] | None = None
) -> tuple[list[bytes], list[int]]:
    """Serialized tf.Examples for the rows of a Parquet file (or folder), and each row's number
    (1-based, counted across the files in name order). Typed as `csv_to_examples` types cells;
    nulls are left out of the example."""
    import tensorflow as tf

    from fullthrottle.core import parquet

    source = Path(path)
    if not source.exists():
        from fullthrottle.core.paths import missing_path_message

        raise DataError(
            missing_path_message(path, "input", "; point --parquet at a Parquet file or folder")
        )
    files = parquet.parquet_files(source, field="--parquet")
    schema = parquet.common_schema(files)
    spec = config.data
    if kinds is None:
        numeric = set(spec.numeric)
        kinds = {name: "float" if name in numeric else "bytes" for name in spec.feature_columns}
    missing = [c for c in kinds if c not in schema.names]
    if missing:
        raise DataError(
            f"{path}: the Parquet file lacks the feature column(s) {missing} the model takes; "
            f"it has {schema.names}"
        )
    for name in kinds:
        if parquet.kind_of(schema.field(name).type) is None:
            raise DataError(
                f"{path}: column {name!r} is of an unsupported type "
                f"({parquet.unsupported_reason(schema.field(name).type)})"
            )
    parquet.check_not_empty(files, where=path)
    data = parquet.read_table(files, list(kinds)).to_pydict()
    examples, rows = [], []
    for number, values in enumerate(zip(*(data[n] for n in kinds), strict=True), start=1):
        features = {}
        for (name, kind), value in zip(kinds.items(), values, strict=True):
            if value is None:
                continue
            if kind == "bytes":
                features[name] = tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[str(value).encode("utf-8")])
                )
            elif kind == "float":
                features[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
            elif isinstance(value, str) or not float(value).is_integer():
                raise DataError(
                    f"{path}, row {number}: column {name!r} takes whole numbers (the model's "
                    f"input is an integer), got {value!r}; cast the column to an integer type"
                )
            else:
                features[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
        examples.append(
            tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
        )
        rows.append(number)
    return examples, rows


def request_body(
    args: argparse.Namespace, config: Config, *, kinds: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], list[int]]:
    """The TF Serving REST body for the input given on the command line, and CSV line numbers
    (Parquet row numbers)."""
    if args.csv or getattr(args, "parquet", None):
        if args.csv:
            examples, lines = csv_to_examples(_read(args.csv), config, source=args.csv, kinds=kinds)
        else:
            examples, lines = parquet_to_examples(args.parquet, config, kinds=kinds)
        body = {
            "signature_name": "serving_default",
            "instances": [{"b64": base64.b64encode(e).decode()} for e in examples],
        }
        return body, lines
    try:
        data = json.loads(_read(args.json))
    except json.JSONDecodeError as exc:
        raise DataError(f"{args.json} is not valid JSON: {exc}") from None
    if isinstance(data, list):
        return {"signature_name": "predict_raw", "instances": data}, []
    if isinstance(data, dict):
        return data, []
    raise DataError(
        f"{args.json} must hold a request body (an object) or a list of feature objects"
    )


def metadata_rest(url: str, *, timeout: float) -> dict[str, Any] | None:
    """TF Serving's metadata reply at `url`; None when the server has no such route (404)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise ServingError(
            f"the server at {url} answered {exc.code}: {exc.read().decode('utf-8', 'replace')[:300]}"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServingError(
            f"cannot reach {url}: {reason}; is `fullthrottle serve` (or TF Serving) running there?"
        ) from None
    except json.JSONDecodeError:
        return None


def metadata_grpc(
    target: str, *, model_name: str, version: int | None, timeout: float
) -> dict[str, Any] | None:
    """TF Serving's gRPC GetModelMetadata, as the REST reply's JSON."""
    import grpc
    from google.protobuf import json_format
    from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = model_name
    if version is not None:
        request.model_spec.version.value = version
    request.metadata_field.append("signature_def")
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        try:
            response = stub.GetModelMetadata(request, timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND):
                return None
            raise ServingError(
                f"gRPC GetModelMetadata at {target} failed: {exc.code().name}: {exc.details()}"
            ) from None
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signature_map)
    # Field names as in the REST reply (signature_def, not protobuf JSON's signatureDef).
    as_json = json_format.MessageToDict(signature_map, preserving_proto_field_name=True)
    return {"metadata": {"signature_def": as_json}}


# A serving_default refusal for a missing feature names the feature but not the example:
# "Feature: island (data type: string) is required but could not be found."
_REQUIRED_FEATURE = re.compile(r"Feature: (?P<key>.+?) \(data type: \w+\) is required")


def _with_csv_line(
    error: ServingError,
    *,
    examples: list[bytes],
    lines: list[int],
    source: str,
    unit: str = "line(s)",
) -> ServingError:
    """Adds the CSV line (Parquet row: `unit` "row(s)") and column to a server refusal of a
    missing required feature."""
    import tensorflow as tf

    found = _REQUIRED_FEATURE.search(str(error))
    if not found:
        return error
    key = found["key"]
    lacking = [
        line
        for example, line in zip(examples, lines, strict=True)
        if key not in tf.train.Example.FromString(example).features.feature
    ]
    if not lacking:
        return error
    shown = ", ".join(str(line) for line in lacking[:10]) + (" ..." if len(lacking) > 10 else "")
    return ServingError(
        f"{error} In {source}, column {key!r} is empty or missing on {unit} {shown}: the model "
        "needs it in every row; fill in those cells"
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
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            detail = json.loads(detail).get("error", detail)
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
    if "predictions" in outputs:  # a regression model: one number per example
        return {"predictions": [float(v) for v in outputs["predictions"].tolist()]}
    probabilities = outputs["probabilities"].tolist()
    classes = [c.decode() for c in outputs["classes"].tolist()]
    return {
        "predictions": [
            {"classes": c, "probabilities": p} for c, p in zip(classes, probabilities, strict=True)
        ]
    }


def _json_example(instance: Mapping[str, Any]) -> bytes:
    """A feature object of a JSON request as a serialized tf.Example (strings as bytes, whole
    numbers as int64, other numbers as floats), for the `classification` signature."""
    import tensorflow as tf

    features = {}
    for name, value in instance.items():
        values = value if isinstance(value, list) else [value]
        if all(isinstance(v, str) for v in values):
            feature = tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[v.encode("utf-8") for v in values])
            )
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            feature = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        else:
            feature = tf.train.Feature(float_list=tf.train.FloatList(value=values))
        features[name] = feature
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def first_example(body: dict[str, Any]) -> bytes | None:
    """The first example of a request, serialized; None when the body is not one we built."""
    instances = body.get("instances") or []
    if not instances:
        return None
    first = instances[0]
    if body.get("signature_name") == "serving_default":
        return base64.b64decode(first["b64"])
    if body.get("signature_name") == "predict_raw" and isinstance(first, dict):
        return _json_example(first)
    return None


def class_names(
    example: bytes,
    *,
    rest_url: str | None,
    grpc_target: str | None,
    model_name: str,
    version: int | None,
    timeout: float,
) -> list[str] | None:
    """Every class name, in the order of the model's probabilities, from its `classification`
    signature (TF Serving's Predict runs a classify signature too); None when the model has
    none (not a fullthrottle model)."""
    try:
        if grpc_target:
            import grpc
            import tensorflow as tf
            from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

            request = predict_pb2.PredictRequest()
            request.model_spec.name = model_name
            request.model_spec.signature_name = "classification"
            if version is not None:
                request.model_spec.version.value = version
            request.inputs["inputs"].CopyFrom(tf.make_tensor_proto([example], dtype=tf.string))
            with grpc.insecure_channel(grpc_target) as channel:
                stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                try:
                    response = stub.Predict(request, timeout=timeout)
                except grpc.RpcError:
                    return None
            names = tf.make_ndarray(response.outputs["classes"])[0].tolist()
            return [n.decode("utf-8") for n in names]
        body = {
            "signature_name": "classification",
            "instances": [{"b64": base64.b64encode(example).decode()}],
        }
        prediction = predict_rest(rest_url or "", body, timeout=timeout)["predictions"][0]
        return [str(name) for name in prediction["classes"]]
    except (ServingError, KeyError, IndexError, TypeError):
        return None


def row_text(row: Any, names: list[str] | None) -> str:
    """One prediction as a line: the class, then each class name with its probability; a
    regression model's number as it is."""
    if isinstance(row, (int, float)) and not isinstance(row, bool):
        return repr(float(row))
    probabilities = row.get("probabilities", [])
    if names is not None and len(names) == len(probabilities):
        shown = " ".join(f"{name}={p:.4f}" for name, p in zip(names, probabilities, strict=True))
    else:
        shown = " ".join(f"{p:.4f}" for p in probabilities)
    return f"{row.get('classes')}\t{shown}"


def _rows(response: dict[str, Any]) -> list[dict[str, Any]]:
    if "predictions" in response:
        return list(response["predictions"])
    outputs = response.get("outputs") or {}
    if isinstance(outputs, list):  # the columnar answer of a model with one output: numbers
        return list(outputs)
    classes, probabilities = outputs.get("classes", []), outputs.get("probabilities", [])
    return [{"classes": c, "probabilities": p} for c, p in zip(classes, probabilities, strict=True)]


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    model_name = args.model_name or config.model_name
    check_name(model_name, "--model-name")
    version_path = f"/versions/{args.version}" if args.version is not None else ""
    base = (args.url or f"http://{config.serving.host}:{config.serving.rest_port}").rstrip("/")
    kinds = None
    rows_input = args.csv or getattr(args, "parquet", None)
    if rows_input:
        # Type the cells as the served model declares its raw inputs (int64 columns stay int64).
        if args.grpc:
            metadata = metadata_grpc(
                args.grpc, model_name=model_name, version=args.version, timeout=args.timeout
            )
        else:
            metadata = metadata_rest(
                f"{base}/v1/models/{model_name}{version_path}/metadata", timeout=args.timeout
            )
        kinds = raw_input_kinds(metadata) if metadata is not None else None
        if kinds is None:
            print(
                "fullthrottle predict: note: the server did not describe the model's raw inputs "
                "(no metadata route or no predict_raw signature); cells are typed by the "
                "config's data spec, numbers as floats",
                file=sys.stderr,
            )
    body, lines = request_body(args, config, kinds=kinds)
    url = f"{base}/v1/models/{model_name}{version_path}:predict"
    try:
        if args.grpc:
            response = predict_grpc(
                args.grpc, body, model_name=model_name, version=args.version, timeout=args.timeout
            )
        else:
            response = predict_rest(url, body, timeout=args.timeout)
    except ServingError as exc:
        if rows_input:
            examples = [base64.b64decode(i["b64"]) for i in body["instances"]]
            raise _with_csv_line(
                exc,
                examples=examples,
                lines=lines,
                source=rows_input,
                unit="line(s)" if args.csv else "row(s)",
            ) from None
        raise
    rows = _rows(response)
    if args.output == "json":
        print(json.dumps(rows))
    else:
        # Class names for a classifier's rows; a regression model's rows are numbers.
        example = first_example(body) if rows and isinstance(rows[0], dict) else None
        names = (
            class_names(
                example,
                rest_url=url,
                grpc_target=args.grpc,
                model_name=model_name,
                version=args.version,
                timeout=args.timeout,
            )
            if example is not None
            else None
        )
        for row in rows:
            print(row_text(row, names))
    return exit_status.SUCCESS
