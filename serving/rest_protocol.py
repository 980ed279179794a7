"""TF Serving's REST predict format, decoded and encoded without a server.

`decode_predict_request` turns a request body (``instances`` row format or ``inputs`` columnar
format, optional ``signature_name``) into named arrays for one signature, and refuses anything
TF Serving would refuse, with a message naming the key, the feature and the instance:
a body that is not a JSON object, neither or both of ``instances``/``inputs``, an unknown or
missing feature, a value of the wrong type or shape, an empty batch, unequal column lengths.
`encode_predict_response` writes ``{"predictions": [...]}`` for row requests and
``{"outputs": {...}}`` for columnar ones, as TF Serving does.

One extension: ``null`` for a float input means "missing" and becomes NaN (which the Transform
graph imputes); strict JSON has no NaN literal.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from serving.signatures import SERVING_DEFAULT


class RequestError(ValueError):
    """The request cannot be answered as sent; the message says what to change."""


@dataclass(frozen=True)
class DecodedRequest:
    signature: str
    inputs: dict[str, np.ndarray]
    row_format: bool
    batch_size: int


def _scalar(value: Any, *, name: str, spec: tf.TensorSpec, where: str) -> Any:
    """One scalar of input `name`, checked against its dtype."""
    if isinstance(value, (list, dict)) and not (isinstance(value, dict) and set(value) == {"b64"}):
        raise RequestError(
            f"{where}: input {name!r} takes one {spec.dtype.name} value per example, got a nested "
            f"{type(value).__name__} (wrong shape)"
        )
    if spec.dtype == tf.string:
        if isinstance(value, dict):
            try:
                return base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise RequestError(
                    f"{where}: input {name!r} has a `b64` value that is not base64"
                ) from None
        if isinstance(value, str):
            return value.encode("utf-8")
        raise RequestError(
            f"{where}: input {name!r} takes a string, got {type(value).__name__} {value!r}"
        )
    if isinstance(value, dict):
        raise RequestError(f"{where}: input {name!r} takes a number, got a `b64` object")
    if spec.dtype.is_floating:
        if value is None:
            return math.nan
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RequestError(
                f"{where}: input {name!r} takes a number, got {type(value).__name__} {value!r}"
            )
        return float(value)
    if spec.dtype.is_integer:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or float(value) != int(value)
        ):
            raise RequestError(
                f"{where}: input {name!r} takes an integer, got {type(value).__name__} {value!r}"
            )
        return int(value)
    raise RequestError(
        f"{where}: input {name!r} has dtype {spec.dtype.name}, which JSON requests cannot fill"
    )


def _column(values: list[Any], *, name: str, spec: tf.TensorSpec, where: str) -> np.ndarray:
    """A batch of values for input `name`; [None] inputs take scalars, [None, k] take k-lists."""
    inner = list(spec.shape[1:])
    converted = []
    for index, value in enumerate(values):
        here = f"{where}[{index}]"
        if inner:
            if not isinstance(value, list) or (inner[0] is not None and len(value) != inner[0]):
                raise RequestError(
                    f"{here}: input {name!r} takes a list of {inner[0]} values per example (wrong shape)"
                )
            converted.append([_scalar(v, name=name, spec=spec, where=here) for v in value])
        else:
            converted.append(_scalar(value, name=name, spec=spec, where=here))
    if spec.dtype == tf.string:
        return np.array(converted, dtype=object)
    return np.array(converted, dtype=spec.dtype.as_numpy_dtype)


def decode_predict_request(
    body: Any, *, signatures: Mapping[str, Mapping[str, tf.TensorSpec]]
) -> DecodedRequest:
    """Named input arrays for the signature a TF Serving REST predict body asks for.

    `signatures` maps each signature name to its named input specs.
    """
    if not isinstance(body, dict):
        raise RequestError(
            f"the request body must be a JSON object with `instances` or `inputs`, got {type(body).__name__}"
        )
    unknown_keys = set(body) - {"instances", "inputs", "signature_name"}
    if unknown_keys:
        raise RequestError(
            f"unknown request key(s) {sorted(unknown_keys)}; a predict body has `instances` or `inputs` "
            "and optionally `signature_name`"
        )
    has_instances, has_inputs = "instances" in body, "inputs" in body
    if has_instances == has_inputs:
        raise RequestError(
            "send exactly one of `instances` (row format) or `inputs` (columnar format)"
            + ("; this request has both" if has_instances else "; this request has neither")
        )
    signature = body.get("signature_name", SERVING_DEFAULT)
    if not isinstance(signature, str) or signature not in signatures:
        raise RequestError(
            f"unknown `signature_name` {signature!r}; this model has {sorted(signatures)}"
        )
    specs = signatures[signature]
    names = sorted(specs)

    if has_instances:
        instances = body["instances"]
        if not isinstance(instances, list):
            raise RequestError(
                f"`instances` must be a list of examples, got {type(instances).__name__}"
            )
        if not instances:
            raise RequestError("`instances` is empty: send at least one example")
        columns: dict[str, list[Any]] = {name: [] for name in names}
        for index, instance in enumerate(instances):
            if len(names) == 1 and not (isinstance(instance, dict) and set(instance) == set(names)):
                columns[names[0]].append(instance)
                continue
            if not isinstance(instance, dict):
                raise RequestError(
                    f"`instances[{index}]` must be an object with the inputs {names} of signature "
                    f"{signature!r}, got {type(instance).__name__}"
                )
            _check_names(instance, names, signature=signature, where=f"`instances[{index}]`")
            for name in names:
                columns[name].append(instance[name])
        arrays = {
            name: _column(columns[name], name=name, spec=specs[name], where="`instances`")
            for name in names
        }
        return DecodedRequest(signature, arrays, row_format=True, batch_size=len(instances))

    inputs = body["inputs"]
    if len(names) == 1 and not isinstance(inputs, dict):
        inputs = {names[0]: inputs}
    if not isinstance(inputs, dict):
        raise RequestError(
            f"`inputs` must be an object mapping each input of signature {signature!r} ({names}) to a "
            f"list, got {type(inputs).__name__}"
        )
    _check_names(inputs, names, signature=signature, where="`inputs`")
    arrays = {}
    sizes = set()
    for name in names:
        column = inputs[name]
        if not isinstance(column, list):
            raise RequestError(
                f"`inputs.{name}` must be a list with one value per example (wrong shape)"
            )
        if not column:
            raise RequestError(f"`inputs.{name}` is empty: send at least one example")
        arrays[name] = _column(column, name=name, spec=specs[name], where=f"`inputs.{name}`")
        sizes.add(len(column))
    if len(sizes) != 1:
        raise RequestError(
            f"the lists in `inputs` must have one length (the batch size), got lengths {sorted(sizes)}"
        )
    return DecodedRequest(signature, arrays, row_format=False, batch_size=sizes.pop())


def _check_names(given: Mapping[str, Any], names: list[str], *, signature: str, where: str) -> None:
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise RequestError(
            f"{where}: unknown feature(s) {unknown} for signature {signature!r}; its inputs are {names}"
        )
    missing = sorted(set(names) - set(given))
    if missing:
        raise RequestError(
            f"{where}: missing feature(s) {missing} for signature {signature!r}; send every input of {names}"
        )


def _plain(array: np.ndarray) -> Any:
    if array.dtype == object or array.dtype.kind in ("S", "O"):
        return [
            _plain(v) if isinstance(v, np.ndarray) else v.decode("utf-8", "replace") for v in array
        ]
    return array.tolist()


def encode_predict_response(outputs: Mapping[str, Any], *, row_format: bool) -> dict[str, Any]:
    """TF Serving's response body for a signature's outputs (tensors or arrays)."""
    columns = {name: _plain(np.asarray(value)) for name, value in outputs.items()}
    if not row_format:
        return {"outputs": columns}
    names = sorted(columns)
    batch = len(columns[names[0]])
    if len(names) == 1:
        return {"predictions": columns[names[0]]}
    return {"predictions": [{name: columns[name][i] for name in names} for i in range(batch)]}
