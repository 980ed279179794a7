"""The served versions of one model, and what TF Serving does with them, protocol aside.

`VersionedModels` owns which versions of the push folder are loaded (the newest
`serve_versions` complete ones, plus every version a label points at), the label -> version
map, and the switch to a new version (one assignment, so a request sees one consistent set).
`resolve` turns a model spec (name, and a version or a label) into a loaded version with TF
Serving's errors; `predict`, `classify` and `regress` run a signature the way TF Serving's
predictor, classifier and regressor do, with TF Serving's checks and messages; `metadata` and
`status` build TF Serving's `GetModelMetadataResponse` and `GetModelStatusResponse` protos, which
the REST API writes as JSON and the gRPC API sends as they are.

Signature method names (predict, classify, regress) are read from ``saved_model.pb``: a
TensorFlow 2 loader does not expose them, and TF Serving decides by them whether a signature
may be classified or regressed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from serving.push import WARMUP_RELATIVE_PATH, replay_warmup, version_dirs
from serving.signatures import signature_keywords
from serving.status import StatusError, from_tensorflow, invalid_argument, not_found

log = logging.getLogger("fullthrottle.serve")

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
# TF Serving's tensor keys for classification and regression signatures.
CLASSIFY_INPUTS = "inputs"
CLASSIFY_OUTPUT_CLASSES = "classes"
CLASSIFY_OUTPUT_SCORES = "scores"
REGRESS_INPUTS = "inputs"
REGRESS_OUTPUTS = "outputs"


@dataclass(frozen=True)
class LoadedVersion:
    version: int
    path: str
    functions: Mapping[str, Any]  # signature key -> concrete function
    signature_defs: Mapping[str, Any]  # signature key -> SignatureDef proto (saved_model.pb)
    warmup_records: int
    owner: Any  # the loaded SavedModel object: the functions reference its variables
    # signature key -> {SignatureDef input key: the function's keyword}, where they differ
    keywords: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def signature(self, name: str) -> tuple[Any, Any]:
        """(SignatureDef, function) for `name` ('' is serving_default), TF Serving's refusal else."""
        key = name or DEFAULT_SIGNATURE
        if key not in self.functions:
            raise StatusError("FAILED_PRECONDITION", f'Serving signature key "{key}" not found.')
        return self.signature_defs[key], self.functions[key]


def is_complete(path: str) -> bool:
    """A version folder TF Serving could load: saved_model.pb and, if any, the variables index."""
    if not os.path.isfile(os.path.join(path, "saved_model.pb")):
        return False
    variables = os.path.join(path, "variables")
    return not os.path.isdir(variables) or os.path.isfile(
        os.path.join(variables, "variables.index")
    )


def read_signature_defs(path: str) -> dict[str, Any]:
    """The SignatureDefs of a SavedModel's serving meta graph, as saved_model.pb has them."""
    from tensorflow.core.protobuf import saved_model_pb2

    model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as file:
        model.ParseFromString(file.read())
    for meta_graph in model.meta_graphs:
        if "serve" in meta_graph.meta_info_def.tags:
            return dict(meta_graph.signature_def)
    raise ValueError(f"{path}/saved_model.pb has no meta graph tagged 'serve'")


def load_version(version: int, path: str) -> LoadedVersion:
    """Loads one version and replays its warmup records (as TF Serving does) before it serves."""
    signature_defs = read_signature_defs(path)
    loaded = tf.saved_model.load(path)
    functions = dict(loaded.signatures)
    warmup_path = os.path.join(path, WARMUP_RELATIVE_PATH)
    warmed = 0
    if os.path.isfile(warmup_path):
        records = [r.numpy() for r in tf.data.TFRecordDataset(warmup_path)]
        # Replayed on the object loaded above: the warmed functions are the ones that serve.
        warmed = replay_warmup(path, records, loaded=loaded)
    keywords = {key: signature_keywords(loaded, key) for key in functions}
    return LoadedVersion(version, path, functions, signature_defs, warmed, loaded, keywords)


class VersionedModels:
    """The loaded versions of one model, refreshed from its push folder, and its labels.

    Owns: which versions are loaded (the newest `serve_versions` complete ones, and those a
    label points at, as TF Serving requires a labelled version to be loaded), the label map and
    the switch. Refuses: folders that are not integers (staging, deleting), incomplete folders,
    versions that fail to load or to answer their warmup (logged, skipped, not retried).
    """

    def __init__(self, serving_dir: str, *, model_name: str, serve_versions: int) -> None:
        self.serving_dir = serving_dir
        self.model_name = model_name
        self.serve_versions = serve_versions
        self._loaded: dict[int, LoadedVersion] = {}
        self._labels: dict[str, int] = {}
        self._failed: set[int] = set()
        self._lock = threading.Lock()  # one refresh at a time; readers never take it

    @property
    def versions(self) -> dict[int, LoadedVersion]:
        return self._loaded  # replaced, never mutated: a reader sees one consistent set

    @property
    def labels(self) -> dict[str, int]:
        return self._labels

    def newest(self) -> LoadedVersion | None:
        loaded = self._loaded
        return loaded[max(loaded)] if loaded else None

    def refresh(self, labels: Mapping[str, int] | None = None) -> list[int]:
        """Loads new complete versions (and labelled ones), unloads the rest; returns new ones.

        `labels` (label -> version) replaces the label map once the versions it names are
        loaded, so a label never points at a version that is still loading.
        """
        with self._lock:
            wanted_labels = dict(self._labels if labels is None else labels)
            candidates = {
                v: p
                for v, p in version_dirs(self.serving_dir).items()
                if v not in self._failed and is_complete(p)
            }
            wanted = set(sorted(candidates, reverse=True)[: self.serve_versions])
            wanted |= {v for v in wanted_labels.values() if v in candidates}
            current = self._loaded
            updated = {v: current[v] for v in wanted if v in current}
            new = []
            for version in sorted(wanted - set(updated)):
                try:
                    updated[version] = load_version(version, candidates[version])
                    new.append(version)
                except Exception as exc:  # noqa: BLE001 - a bad version must not stop serving the good one
                    self._failed.add(version)
                    log.error(
                        "version %s in %s cannot be served, skipped: %s",
                        version,
                        self.serving_dir,
                        exc,
                    )
            if not updated and current:
                return []  # nothing loadable now (e.g. the folder was emptied): keep serving
            self._loaded = dict(sorted(updated.items()))  # the switch: one assignment
            self._labels = wanted_labels
            return new

    def resolve(
        self, name: str, *, version: int | None = None, label: str | None = None
    ) -> LoadedVersion:
        """The loaded version a model spec asks for, or TF Serving's error for it."""
        loaded = self._loaded
        if label is not None:
            if name != self.model_name or label not in self._labels:
                raise invalid_argument(f"Unrecognized servable version label: {label}")
            version = self._labels[label]
        if name != self.model_name:
            raise not_found(_servable_request(name, version))
        if version is None:
            if not loaded:
                raise not_found(_servable_request(name, None))
            return loaded[max(loaded)]
        if version not in loaded:
            raise not_found(_servable_request(name, version))
        return loaded[version]

    def status(self, name: str, *, version: int | None = None, label: str | None = None) -> Any:
        """TF Serving's GetModelStatusResponse: every loaded version, or the one asked for."""
        from tensorflow_serving.apis import get_model_status_pb2

        if name != self.model_name:
            raise not_found(f"Could not find any versions of model {name}")
        if label is not None:
            if label not in self._labels:
                raise invalid_argument(f"Unrecognized servable version label: {label}")
            version = self._labels[label]
        loaded = self._loaded
        if version is not None and version not in loaded:
            raise not_found(f"Could not find version {version} of model {name}")
        versions = sorted(loaded, reverse=True) if version is None else [version]
        response = get_model_status_pb2.GetModelStatusResponse()
        for number in versions:
            entry = response.model_version_status.add()
            entry.version = number
            entry.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
        return response


def _servable_request(name: str, version: int | None) -> str:
    """TF Serving's words for a model spec nothing answers (its ServableRequest's DebugString)."""
    spec = f"Latest({name})" if version is None else f"Specific({name}, {version})"
    return f"Servable not found for request: {spec}"


def metadata(loaded: LoadedVersion, *, model_name: str) -> Any:
    """TF Serving's GetModelMetadataResponse for one version: every SignatureDef it has."""
    from tensorflow_serving.apis import get_model_metadata_pb2

    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.model_spec.name = model_name
    response.model_spec.version.value = loaded.version
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    for key, signature_def in loaded.signature_defs.items():
        signature_map.signature_def[key].CopyFrom(signature_def)
    response.metadata["signature_def"].Pack(signature_map)
    return response


def _run(function: Any, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    try:
        outputs = function(**{name: tf.constant(value) for name, value in inputs.items()})
    except (tf.errors.OpError, TypeError, ValueError) as exc:
        raise from_tensorflow(exc) from None
    return {name: value.numpy() for name, value in outputs.items()}


def predict(
    loaded: LoadedVersion,
    signature_name: str,
    inputs: Mapping[str, np.ndarray],
    *,
    output_filter: Sequence[str] = (),
) -> dict[str, np.ndarray]:
    """Runs a signature on named input arrays (already typed by `input_dtypes`)."""
    signature_def, function = loaded.signature(signature_name)
    expected = set(signature_def.inputs)
    if set(inputs) != expected:
        missing = sorted(expected - set(inputs))
        extra = sorted(set(inputs) - expected)
        raise invalid_argument(
            "input size does not match signature: "
            f"{len(inputs)}!={len(expected)} len({{{', '.join(sorted(inputs))}}}) != "
            f"len({{{', '.join(sorted(expected))}}}). Sent extra: {extra}. Missing but required: "
            f"{missing}."
        )
    keywords = loaded.keywords.get(signature_name or DEFAULT_SIGNATURE, {})
    outputs = _run(function, {keywords.get(name, name): value for name, value in inputs.items()})
    if output_filter:
        unknown = [name for name in output_filter if name not in outputs]
        if unknown:
            raise invalid_argument(
                f"output tensor alias not found in signature: {unknown[0]} Outputs expected to be "
                f"in the set {{{','.join(sorted(outputs))}}}."
            )
        outputs = {name: outputs[name] for name in output_filter}
    return outputs


def input_dtypes(loaded: LoadedVersion, signature_name: str) -> dict[str, int]:
    """Signature input key -> TensorFlow DataType enum (what a JSON value must be converted to)."""
    signature_def, _ = loaded.signature(signature_name)
    return {key: info.dtype for key, info in signature_def.inputs.items()}


def _method_signature(loaded: LoadedVersion, signature_name: str, method: str) -> tuple[Any, Any]:
    key = signature_name or DEFAULT_SIGNATURE
    if key not in loaded.functions:
        raise invalid_argument(f"No signature was found with the name: {key}")
    signature_def, function = loaded.signature(key)
    if signature_def.method_name != method:
        kind = "classification" if method == CLASSIFY_METHOD else "regression"
        raise invalid_argument(
            f"Expected {kind} signature method_name to be {method}. Was: "
            f"{signature_def.method_name}"
        )
    if len(signature_def.inputs) != 1:
        raise invalid_argument("Expected one input Tensor.")
    return signature_def, function


def classify(
    loaded: LoadedVersion, signature_name: str, examples: Sequence[bytes]
) -> list[list[tuple[str, float]]]:
    """TF Serving's Classify: (label, score) pairs per serialized tf.Example."""
    signature_def, function = _method_signature(loaded, signature_name, CLASSIFY_METHOD)
    if not examples:
        raise invalid_argument("Input is empty.")
    outputs = signature_def.outputs
    if len(outputs) not in (1, 2):
        raise invalid_argument(f"Expected one or two output Tensors, found {len(outputs)}")
    (input_key,) = signature_def.inputs
    result = _run(function, {input_key: np.array(list(examples), dtype=object)})
    classes = result.get(CLASSIFY_OUTPUT_CLASSES)
    scores = result.get(CLASSIFY_OUTPUT_SCORES)
    if classes is None and scores is None:
        raise invalid_argument(
            f"Expected classification signature outputs to contain at least one of "
            f"{CLASSIFY_OUTPUT_CLASSES!r} or {CLASSIFY_OUTPUT_SCORES!r}"
        )
    batch = len(examples)
    for name, tensor in ((CLASSIFY_OUTPUT_CLASSES, classes), (CLASSIFY_OUTPUT_SCORES, scores)):
        if tensor is not None and (tensor.ndim != 2 or tensor.shape[0] != batch):
            raise invalid_argument(
                f"Expected Tensor shape: [{batch} num_classes] but got {list(tensor.shape)}"
                f" for output {name!r}"
            )
    width = (scores if scores is not None else classes).shape[1]
    rows = []
    for i in range(batch):
        rows.append(
            [
                (
                    classes[i, j].decode("utf-8", "replace") if classes is not None else "",
                    float(scores[i, j]) if scores is not None else 0.0,
                )
                for j in range(width)
            ]
        )
    return rows


def regress(loaded: LoadedVersion, signature_name: str, examples: Sequence[bytes]) -> list[float]:
    """TF Serving's Regress: one value per serialized tf.Example."""
    signature_def, function = _method_signature(loaded, signature_name, REGRESS_METHOD)
    if not examples:
        raise invalid_argument("Input is empty.")
    if len(signature_def.outputs) != 1 or REGRESS_OUTPUTS not in signature_def.outputs:
        raise invalid_argument(
            f"Expected one output Tensor named {REGRESS_OUTPUTS!r}, found "
            f"{sorted(signature_def.outputs)}"
        )
    (input_key,) = signature_def.inputs
    values = _run(function, {input_key: np.array(list(examples), dtype=object)})[REGRESS_OUTPUTS]
    batch = len(examples)
    if values.shape not in ((batch,), (batch, 1)):
        raise invalid_argument(
            "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
            f"{list(values.shape)}"
        )
    return [float(v) for v in values.reshape(-1)]


def merge_context(context: bytes | None, examples: Sequence[bytes]) -> list[bytes]:
    """ExampleListWithContext -> serialized examples, as TF Serving builds them.

    Concatenating two serialized messages merges them (a feature in the example replaces the
    context's feature of the same name), which is how TF Serving joins them.
    """
    if not context:
        return list(examples)
    return [context + example for example in examples]


LabelSource = Callable[[], Mapping[str, int]]
