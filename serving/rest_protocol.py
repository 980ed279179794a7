"""TF Serving's REST JSON, decoded and encoded without a server, by TF Serving's own rules.

The rules and the error texts follow TF Serving's ``util/json_tensor.cc``, so a client cannot
tell the two apart by what it sends or gets back:

- Bodies are JSON objects in any content type. ``NaN``, ``Infinity`` and ``-Infinity`` are
  numbers; top-level keys other than the ones a method reads are ignored.
- Predict: ``instances`` (row format; each instance an object of named inputs, or a plain
  value when the signature has one input) or ``inputs`` (columnar; an object of named inputs,
  or a plain value/list for one input; extra names ignored). A value's type must be what the
  input's dtype takes (JSON integers for integer inputs, ``true``/``false`` for ``DT_BOOL``,
  strings or ``{"b64": ...}`` for ``DT_STRING``). An integer literal sent to a float input is
  rounded to the nearest float32 (``16777217`` is 16777216, as TF Serving documents under
  "Floating Point Precision" in api_rest.md); a decimal outside the float32 range is refused.
- Predict responses: ``{"predictions": [...]}`` for row requests (an object per instance when
  there are several outputs, the value alone when there is one), ``{"outputs": ...}`` for
  columnar ones (an object of outputs, the value alone when there is one). Floats are written
  as the shortest decimal that reads back as the same float32; ``NaN``/``Infinity`` as such.
  String outputs whose name ends in ``_bytes`` are written as ``{"b64": ...}``.
- Classify and regress: ``examples`` (a list of objects, each a ``tf.Example`` in JSON: integers
  become ``int64_list``, other numbers ``float_list``, strings and ``{"b64"}`` ``bytes_list``,
  booleans 0/1) and an optional ``context`` merged into each; responses ``{"results": ...}``.

Errors raise `StatusError` with TF Serving's code and message. Where TF Serving would echo the
whole request in a message, it is cut at `_ECHO_LIMIT` characters.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.status import StatusError, invalid_argument

_ECHO_LIMIT = 256
_BYTES_SUFFIX = "_bytes"

# TensorFlow DataType enum values (tensorflow/core/framework/types.proto).
DT_FLOAT, DT_DOUBLE, DT_INT32, DT_UINT8, DT_INT16, DT_INT8, DT_STRING = 1, 2, 3, 4, 5, 6, 7
DT_INT64, DT_BOOL, DT_UINT16, DT_HALF, DT_UINT32, DT_UINT64, DT_BFLOAT16 = 9, 10, 17, 19, 22, 23, 14
_DTYPE_NAMES = {
    DT_FLOAT: "float",
    DT_DOUBLE: "double",
    DT_INT32: "int32",
    DT_UINT8: "uint8",
    DT_INT16: "int16",
    DT_INT8: "int8",
    DT_STRING: "string",
    DT_INT64: "int64",
    DT_BOOL: "bool",
    DT_UINT16: "uint16",
    DT_HALF: "half",
    DT_UINT32: "uint32",
    DT_UINT64: "uint64",
    DT_BFLOAT16: "bfloat16",
}
_NUMPY_DTYPES = {
    DT_FLOAT: np.float32,
    DT_DOUBLE: np.float64,
    DT_INT32: np.int32,
    DT_UINT8: np.uint8,
    DT_INT16: np.int16,
    DT_INT8: np.int8,
    DT_STRING: object,
    DT_INT64: np.int64,
    DT_BOOL: np.bool_,
    DT_UINT32: np.uint32,
    DT_UINT64: np.uint64,
}
_INT_RANGES = {
    DT_INT32: (-(2**31), 2**31 - 1),
    DT_INT16: (-(2**31), 2**31 - 1),  # TF Serving reads these as int32, then narrows
    DT_INT8: (-(2**31), 2**31 - 1),
    DT_UINT8: (-(2**31), 2**31 - 1),
    DT_INT64: (-(2**63), 2**63 - 1),
    DT_UINT32: (0, 2**32 - 1),
    DT_UINT64: (0, 2**64 - 1),
}
_NARROW_RANGES = {DT_INT16: (-(2**15), 2**15 - 1), DT_INT8: (-128, 127), DT_UINT8: (0, 255)}
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def dtype_name(dtype: int) -> str:
    return _DTYPE_NAMES.get(dtype, f"dtype enum {dtype}")


def _echo(value: Any) -> str:
    """A JSON value as TF Serving prints it in an error message (cut when long)."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _ECHO_LIMIT else text[:_ECHO_LIMIT] + "..."


def _json_type(value: Any) -> str:
    if value is None:
        return "Null"
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    if isinstance(value, str):
        return "String"
    return "Number"


# Python's JSON messages in RapidJSON's words (TF Serving's parser).
_RAPIDJSON_MESSAGES = {
    "Expecting value": "Invalid value.",
    "Expecting property name enclosed in double quotes": "Missing a name for object member.",
    "Expecting ':' delimiter": "Missing a colon after a name of object member.",
    "Expecting ',' delimiter": "Missing a comma or ']' after an array element.",
    "Extra data": "The document root must not be followed by other values.",
    "Unterminated string starting at": "Missing a closing quotation mark in string.",
    "Invalid \\escape": "Invalid escape character in string.",
    "Invalid \\uXXXX escape": "Incorrect hex digit after \\u escape in string.",
    "Invalid control character at": "Invalid encoding in string.",
}


class _NumberTooBigError(ValueError):
    pass


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999: RapidJSON refuses it; NaN/Infinity literals are not floats here
        raise _NumberTooBigError(text[:40])
    return value


def _parse_int(text: str) -> int | float:
    """An integer literal as RapidJSON reads it: beyond uint64 it becomes a double."""
    digits = text.lstrip("-")
    if len(digits) > 20:
        return _parse_float(text)
    value = int(text)
    return value if -(2**63) <= value <= 2**64 - 1 else float(value)


def parse_body(raw: bytes) -> dict[str, Any]:
    """A request body as TF Serving parses it: a JSON object, NaN and Infinity allowed.

    Bytes that are not UTF-8 inside a string are kept (TF Serving does not validate encoding):
    they are carried as surrogates and restored when the string becomes a tensor.
    """
    if not raw:
        raise invalid_argument("JSON Parse error: The document is empty")
    text = raw.decode("utf-8", "surrogateescape")
    try:
        document = json.loads(text, parse_float=_parse_float, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        offset = len(text[: exc.pos].encode("utf-8", "surrogateescape"))
        message = _RAPIDJSON_MESSAGES.get(exc.msg, exc.msg)
        raise invalid_argument(f"JSON Parse error: {message} at offset: {offset}") from None
    except _NumberTooBigError as exc:
        raise invalid_argument(
            f"JSON Parse error: Number too big to be stored in double. ({exc})"
        ) from None
    except RecursionError:
        raise invalid_argument("JSON Parse error: the document nests too deeply") from None
    if not isinstance(document, dict):
        raise invalid_argument(f"JSON Value: {_echo(document)} Is not object")
    return document


def signature_name(document: Mapping[str, Any]) -> str:
    """The request's `signature_name` ('' when absent: the server uses serving_default)."""
    name = document.get("signature_name", "")
    if not isinstance(name, str):
        raise invalid_argument(
            f"JSON Value: {_echo(document)} not formatted correctly. 'signature_name' key must be "
            "a string value."
        )
    return name


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _is_element_object(value: Any) -> bool:
    return isinstance(value, dict) and not _is_b64(value)


def _to_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _b64decode(value: Any) -> bytes:
    if not _is_b64(value):
        raise invalid_argument(
            f"JSON Value: {_echo(value)} not formatted correctly for base64 data"
        )
    encoded = value["b64"]
    try:
        # TF Serving's absl::Base64Unescape also takes the URL-safe alphabet and no padding.
        normalized = encoded.replace("-", "+").replace("_", "/").strip()
        return base64.b64decode(normalized + "=" * (-len(normalized) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise invalid_argument("Unable to base64 decode") from None


def _type_error(value: Any, dtype: int) -> StatusError:
    return invalid_argument(
        f"JSON Value: {_echo(value)} Type: {_json_type(value)} is not of expected type: "
        f"{dtype_name(dtype)}"
    )


def _is_json_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_json_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _in_range(value: int | float, limit: float) -> bool:
    """Whether a JSON number fits a float type: integer literals always do (they are rounded,
    TF Serving's api_rest.md "Floating Point Precision"); decimals must lie within its range."""
    if isinstance(value, int) or not math.isfinite(value):
        return True
    return -limit <= value <= limit


def _scalar(value: Any, dtype: int) -> Any:
    """One JSON scalar as a value of `dtype`, or TF Serving's refusal."""
    if isinstance(value, dict):
        if dtype == DT_STRING:
            return _b64decode(value)
        raise _type_error(value, dtype)
    if dtype in (DT_FLOAT, DT_HALF, DT_BFLOAT16):
        if not _is_json_number(value):
            raise _type_error(value, dtype)
        if not _in_range(value, _FLOAT32_MAX):
            raise invalid_argument(
                f"Cannot convert JSON value: {_echo(value)} to float without loss of precision."
            )
        return float(value)
    if dtype == DT_DOUBLE:
        if not _is_json_number(value):
            raise _type_error(value, dtype)
        if not _in_range(value, float(np.finfo(np.float64).max)):
            raise invalid_argument(
                f"Cannot convert JSON value: {_echo(value)} to double without loss of precision."
            )
        return float(value)
    if dtype in _INT_RANGES:
        low, high = _INT_RANGES[dtype]
        if not _is_json_int(value) or not low <= value <= high:
            raise _type_error(value, dtype)
        if dtype in _NARROW_RANGES:
            narrow_low, narrow_high = _NARROW_RANGES[dtype]
            if not narrow_low <= value <= narrow_high:
                raise invalid_argument(
                    f"JSON Value: {_echo(value)} is out of the range of {dtype_name(dtype)}"
                )
        return value
    if dtype == DT_STRING:
        if not isinstance(value, str):
            raise _type_error(value, dtype)
        return _to_bytes(value)
    if dtype == DT_BOOL:
        if not isinstance(value, bool):
            raise _type_error(value, dtype)
        return value
    raise StatusError(
        "UNIMPLEMENTED", f"Conversion of JSON Value: {_echo(value)} to type: {dtype_name(dtype)}"
    )


def _dense_shape(value: Any) -> list[int]:
    """The shape a JSON value implies, read from its first elements (TF Serving's rule)."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def _fill(value: Any, level: int, shape: list[int], dtype: int, out: list[Any]) -> None:
    rank = len(shape)
    if not isinstance(value, list):
        if level != rank:
            raise invalid_argument(
                f"JSON Value: {_echo(value)} found at incorrect level: {level + 1} in the JSON "
                f"DOM. Expected at level: {rank}"
            )
        out.append(_scalar(value, dtype))
        return
    if level >= rank:
        raise invalid_argument(f"Encountered list at unexpected level: {level} expected < {rank}")
    if len(value) != shape[level]:
        raise invalid_argument(
            f"Encountered list at unexpected size: {len(value)} at level: {level} expected "
            f"size: {shape[level]}"
        )
    for element in value:
        _fill(element, level + 1, shape, dtype, out)


@dataclass
class _Tensor:
    dtype: int
    shape: list[int]
    values: list[Any]

    def array(self, batch: int | None = None) -> np.ndarray:
        shape = self.shape if batch is None else [batch, *self.shape]
        numpy_dtype = _NUMPY_DTYPES.get(self.dtype, np.float32)
        if numpy_dtype is object:
            array = np.empty(len(self.values), dtype=object)
            array[:] = self.values
        else:
            array = np.array(self.values, dtype=numpy_dtype)
        return array.reshape(shape)


def _tensor(value: Any, dtype: int) -> _Tensor:
    shape = _dense_shape(value)
    values: list[Any] = []
    _fill(value, 0, shape, dtype, values)
    return _Tensor(dtype, shape, values)


def _status_text(error: StatusError) -> str:
    return f"{error.code}: {error.message}"


@dataclass(frozen=True)
class PredictRequest:
    signature_name: str
    inputs: dict[str, np.ndarray]
    row_format: bool


def predict_inputs(document: Mapping[str, Any], dtypes: Mapping[str, int]) -> PredictRequest:
    """Named input arrays for a predict body; `dtypes` maps the signature's inputs to dtypes."""
    name = signature_name(document)
    if not dtypes:
        raise invalid_argument(f"Failed to get input map for signature: {name or 'DEFAULT'}")
    has_instances, has_inputs = "instances" in document, "inputs" in document
    if has_instances and has_inputs:
        raise invalid_argument(
            f"JSON Value: {_echo(document)} Not formatted correctly expecting only one of "
            "'inputs' or 'instances' keys to exist "
        )
    if has_instances:
        instances = document["instances"]
        if not isinstance(instances, list):
            raise invalid_argument(
                f"JSON Value: {_echo(document)} Expecting 'instances' to be an list/array"
            )
        if not instances:
            raise invalid_argument(f"JSON Value: {_echo(document)} No values in 'instances' array")
        return PredictRequest(name, _from_instances(instances, dtypes), row_format=True)
    if has_inputs:
        return PredictRequest(name, _from_inputs(document["inputs"], dtypes), row_format=False)
    raise invalid_argument("Missing 'inputs' or 'instances' key")


def _from_instances(instances: list[Any], dtypes: Mapping[str, int]) -> dict[str, np.ndarray]:
    if not _is_element_object(instances[0]) and len(dtypes) > 1:
        raise invalid_argument(
            "instances is a plain list, but expecting list of objects as multiple input tensors "
            "required as per tensorinfo_map"
        )
    objects = _is_element_object(instances[0])
    names = sorted(dtypes)
    tensors: dict[str, list[_Tensor]] = {name: [] for name in names}

    def add(item: Any, name: str) -> None:
        if name not in dtypes:
            raise invalid_argument(f"JSON object: does not have named input: {name}")
        tensor = _tensor(item, dtypes[name])
        seen = tensors[name]
        if seen:
            first = seen[0]
            if len(first.values) != len(tensor.values):
                raise invalid_argument(
                    f"Expecting tensor size: {len(first.values)} but got: {len(tensor.values)}"
                )
            if first.shape != tensor.shape:
                raise invalid_argument(
                    f"Expecting shape [{','.join(map(str, first.shape))}] but got: "
                    f"[{','.join(map(str, tensor.shape))}]"
                )
        seen.append(tensor)

    for index, element in enumerate(instances):
        if objects:
            if not _is_element_object(element):
                raise invalid_argument(
                    f"Expecting object but got list at item {index} of input list"
                )
            for key, item in element.items():
                try:
                    add(item, key)
                except StatusError as exc:
                    raise invalid_argument(
                        f"Failed to process element: {index} key: {key} of 'instances' list. "
                        f"Error: {_status_text(exc)}"
                    ) from None
            if set(element) != set(names):
                raise invalid_argument(
                    f"Failed to process element: {index} of 'instances' list. JSON object: "
                    f"{_echo(element)} keys must be equal to: {','.join(names)}"
                )
        else:
            if _is_element_object(element):
                raise invalid_argument(
                    f"Expecting value/list but got object at item {index} of input list"
                )
            try:
                add(element, names[0])
            except StatusError as exc:
                raise invalid_argument(
                    f"Failed to process element: {index} of 'instances' list. Error: "
                    f"{_status_text(exc)}"
                ) from None
    arrays = {}
    for name, parts in tensors.items():
        joined = _Tensor(dtypes[name], parts[0].shape, [v for part in parts for v in part.values])
        arrays[name] = joined.array(batch=len(instances))
    return arrays


def _from_inputs(inputs: Any, dtypes: Mapping[str, int]) -> dict[str, np.ndarray]:
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(dtypes) > 1:
            raise invalid_argument(
                "inputs is a plain value/list, but expecting an object as multiple input tensors "
                "required as per tensorinfo_map"
            )
        (name,) = dtypes
        return {name: _tensor(inputs, dtypes[name]).array()}
    arrays = {}
    for name in sorted(dtypes):
        if name not in inputs:
            raise invalid_argument(f"Missing named input: {name} in 'inputs' object.")
        arrays[name] = _tensor(inputs[name], dtypes[name]).array()
    return arrays


def _json_values(name: str, array: np.ndarray) -> Any:
    """An output array as TF Serving writes it: shortest float32 decimals, b64 for *_bytes."""
    if array.dtype == object or array.dtype.kind in ("S", "O"):
        as_bytes = name.endswith(_BYTES_SUFFIX)

        def text(value: Any) -> Any:
            raw = value if isinstance(value, bytes) else str(value).encode()
            if as_bytes:
                return {"b64": base64.b64encode(raw).decode("ascii")}
            return raw.decode("utf-8", "replace")

        flat = [text(v) for v in array.reshape(-1)]
        return _nest(flat, list(array.shape))
    if array.dtype == np.float32 or array.dtype == np.float16:
        # float32 0.2 is 0.2, not 0.20000000298023224: the shortest decimal of the float32.
        return np.array(array.astype(str), dtype=np.float64).tolist()
    return array.tolist()


def _nest(flat: list[Any], shape: list[int]) -> Any:
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return flat
    step = int(np.prod(shape[1:])) if shape[1:] else 1
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def predict_response(outputs: Mapping[str, np.ndarray], *, row_format: bool) -> dict[str, Any]:
    """TF Serving's predict response body for a signature's output arrays."""
    if not outputs:
        raise invalid_argument("Cannot convert empty tensor map to JSON")
    names = sorted(outputs)
    if not row_format:
        columns = {name: _json_values(name, np.asarray(outputs[name])) for name in names}
        return {"outputs": columns[names[0]] if len(names) == 1 else columns}
    batch = 0
    for name in names:
        array = np.asarray(outputs[name])
        if array.ndim == 0:
            raise invalid_argument(f"Tensor name: {name} has no shape information ")
        if array.shape[0] < 1:
            raise invalid_argument(f"Tensor name: {name} has invalid batch size: {array.shape[0]}")
        if batch and array.shape[0] != batch:
            raise invalid_argument(
                f"Tensor name: {name} has inconsistent batch size: {array.shape[0]} expecting: "
                f"{batch}"
            )
        batch = array.shape[0]
    columns = {name: _json_values(name, np.asarray(outputs[name])) for name in names}
    if len(names) == 1:
        return {"predictions": columns[names[0]]}
    return {"predictions": [{name: columns[name][i] for name in names} for i in range(batch)]}


@dataclass(frozen=True)
class ExamplesRequest:
    signature_name: str
    context: bytes | None
    examples: list[bytes]


def examples_request(document: Mapping[str, Any]) -> ExamplesRequest:
    """A classify or regress body as serialized tf.Examples (TF Serving's JSON -> Example rules)."""
    name = signature_name(document)
    context = None
    if "context" in document:
        context = _example(document["context"]).SerializeToString()
    if "examples" not in document:
        # TF Serving says "classify" for regress requests too; verbatim.
        raise invalid_argument(
            f"JSON Value: {_echo(document)} When method is classify, key 'examples' is expected "
            "and was not found"
        )
    examples = document["examples"]
    if not isinstance(examples, list):
        raise invalid_argument(
            f"JSON Value: {_echo(document)} Expecting 'examples' value to be an list/array"
        )
    if not examples:
        raise invalid_argument(f"JSON Value: {_echo(document)} 'examples' value is an empty array")
    return ExamplesRequest(name, context, [_example(e).SerializeToString() for e in examples])


def _example(value: Any) -> Any:
    from tensorflow.core.example import example_pb2

    if not isinstance(value, dict):
        raise invalid_argument(f"Example must be JSON object but got JSON {_json_type(value)}")
    example = example_pb2.Example()
    for name, content in value.items():
        kind: str | None = None
        items = content if isinstance(content, list) else [content]
        values: list[Any] = []
        for item in items:
            item_kind, item_value = _feature_value(item, name)
            if kind is not None and item_kind != kind:
                raise invalid_argument(
                    f"Unexpected element type in feature: {name} expecting type: {_KIND_NAMES[kind]}"
                )
            kind = item_kind
            values.append(item_value)
        feature = example.features.feature[name]
        if kind == "int64":
            feature.int64_list.value.extend(values)
        elif kind == "float":
            feature.float_list.value.extend(values)
        elif kind == "bytes":
            feature.bytes_list.value.extend(values)
    return example


_KIND_NAMES = {"int64": "int64", "float": "float", "bytes": "bytes"}


def _feature_value(item: Any, name: str) -> tuple[str, Any]:
    if item is None or isinstance(item, list) or (isinstance(item, dict) and not _is_b64(item)):
        raise invalid_argument(
            f"Feature: {name} has element with unexpected JSON type: {_json_type(item)}"
        )
    if isinstance(item, bool):
        return "int64", int(item)
    if isinstance(item, dict):
        return "bytes", _b64decode(item)
    if isinstance(item, str):
        return "bytes", _to_bytes(item)
    if isinstance(item, int) and -(2**63) <= item <= 2**63 - 1:
        return "int64", item
    if isinstance(item, int) and 0 <= item <= 2**64 - 1:
        raise invalid_argument(f"Feature: {name} has uint64 element. Only int64 is supported.")
    number = float(item)
    if not _in_range(number, _FLOAT32_MAX):
        raise invalid_argument(
            f"Cannot convert JSON value: {_echo(item)} to float without loss of precision."
        )
    return "float", number


def classify_response(rows: Sequence[Sequence[tuple[str, float]]]) -> dict[str, Any]:
    return {
        "results": [
            [[label, float(np.float32(score).astype(str))] for label, score in row] for row in rows
        ]
    }


def regress_response(values: Sequence[float]) -> dict[str, Any]:
    return {"results": [float(np.float32(v).astype(str)) for v in values]}


def dumps(body: Any) -> bytes:
    """JSON as TF Serving writes it: NaN and Infinity as bare literals.

    Request bytes that were not UTF-8 and are echoed in an error message are written as "?":
    the answer stays valid UTF-8 JSON.
    """
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=True).encode(
        "utf-8", "replace"
    )
