"""The served versions of one model, and what TF Serving does with them, protocol aside.

`VersionedModels` owns which versions of the push folder are loaded (the newest
`serve_versions` complete ones, plus every version a label points at), the label -> version
map, and the switch to a new version (one assignment, so a request sees one consistent set).
`resolve` turns a model spec (name, and a version or a label) into a loaded version with TF
Serving's errors; `predict`, `classify`, `regress` and `multi_inference` run signatures the way
TF Serving's predictor, classifier, regressor and multi-inference runner do, with TF Serving's
checks and messages; `metadata` and `status` build TF Serving's `GetModelMetadataResponse` and
`GetModelStatusResponse` protos, which the REST API writes as JSON and the gRPC API sends as
they are. `status` lists every version the server has seen, as TF Serving's servable state
monitor does: AVAILABLE, LOADING while it loads, END once unloaded or when loading failed.

Which versions are loaded follows a TF Serving version policy (`VersionPolicy`: the latest N,
all, or specific versions), set at start and replaced by `configure` (TF Serving's
`HandleReloadConfigRequest`, see `serving.model_config`).

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
from serving.status import (
    StatusError,
    failed_precondition,
    from_tensorflow,
    invalid_argument,
    not_found,
)

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
# The one metadata field TF Serving serves (get_model_metadata_impl.cc).
SIGNATURE_DEF_FIELD = "signature_def"


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
        """(SignatureDef, function) for `name` ('' is serving_default), TF Serving's refusal else
        (predict_util.cc: FAILED_PRECONDITION)."""
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


@dataclass(frozen=True)
class VersionPolicy:
    """TF Serving's `ServableVersionPolicy`: which complete versions of the folder to load.

    `kind` "latest" loads the newest `num_versions`, "all" every version, "specific" the
    `versions` listed (those that exist).
    """

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("latest", "all", "specific"):
            raise ValueError(f"unknown version policy {self.kind!r}")
        if self.kind == "latest" and self.num_versions < 1:
            raise ValueError(
                f"a latest-versions policy needs num_versions >= 1, got {self.num_versions}"
            )

    def choose(self, available: Sequence[int]) -> set[int]:
        if self.kind == "all":
            return set(available)
        if self.kind == "specific":
            return set(self.versions) & set(available)
        return set(sorted(available, reverse=True)[: self.num_versions])


@dataclass(frozen=True)
class VersionState:
    """One entry of TF Serving's servable state monitor: a manager state and its health."""

    state: str  # ModelVersionStatus.State name: LOADING, AVAILABLE, END
    error_code: str = "OK"
    error_message: str = ""


class VersionedModels:
    """The loaded versions of one model, refreshed from its push folder, and its labels.

    Owns: which versions are loaded (those the version policy picks, and those a label points
    at, as TF Serving requires a labelled version to be loaded), the label map, the switch, and
    the state of every version seen. Labels are the configured ones (`configure`) over the
    ones `refresh` is handed (the MLflow alias): a configured label wins. Refuses: folders that
    are not integers (staging, deleting), incomplete folders, versions that fail to load or to
    answer their warmup (logged, marked END with the error, not retried).
    """

    def __init__(
        self,
        serving_dir: str,
        *,
        model_name: str,
        policy: VersionPolicy,
        labels: Mapping[str, int] | None = None,
    ) -> None:
        self.serving_dir = serving_dir
        self.model_name = model_name
        self._policy = policy
        self._configured_labels = dict(labels or {})
        self._source_labels: dict[str, int] = {}
        self._loaded: dict[int, LoadedVersion] = {}
        self._labels: dict[str, int] = {}
        self._failed: set[int] = set()
        self._states: dict[int, VersionState] = {}
        self._lock = threading.Lock()  # one refresh at a time; readers never take it

    @property
    def versions(self) -> dict[int, LoadedVersion]:
        return self._loaded  # replaced, never mutated: a reader sees one consistent set

    @property
    def labels(self) -> dict[str, int]:
        return self._labels

    @property
    def policy(self) -> VersionPolicy:
        return self._policy

    def newest(self) -> LoadedVersion | None:
        loaded = self._loaded
        return loaded[max(loaded)] if loaded else None

    def refresh(self, labels: Mapping[str, int] | None = None) -> list[int]:
        """Loads new complete versions (and labelled ones), unloads the rest; returns new ones.

        `labels` (label -> version, from a label source such as the MLflow alias; None keeps
        the last ones) joins the configured labels, which win. The label map is replaced once
        the versions it names are loaded, so a label never points at a version still loading.
        """
        with self._lock:
            if labels is not None:
                self._source_labels = dict(labels)
            return self._refresh_locked()

    def configure(self, policy: VersionPolicy, labels: Mapping[str, int]) -> None:
        """Applies a new version policy and configured labels now (TF Serving's config reload).

        Raises StatusError FAILED_PRECONDITION, as TF Serving's server core does, when a label
        names a version that is not available once the policy's versions are loaded; the
        policy stays applied and the labels stay as they were.
        """
        with self._lock:
            previous = self._configured_labels
            self._policy = policy
            self._configured_labels = dict(labels)
            self._refresh_locked()
            for version in sorted(set(labels.values())):
                if version not in self._loaded:
                    self._configured_labels = previous
                    self._labels = {**self._source_labels, **previous}
                    raise failed_precondition(
                        f"Request to assign label to version {version} of model "
                        f"{self.model_name}, which is not currently available for inference"
                    )

    def _refresh_locked(self) -> list[int]:
        wanted_labels = {**self._source_labels, **self._configured_labels}
        candidates = {
            v: p
            for v, p in version_dirs(self.serving_dir).items()
            if v not in self._failed and is_complete(p)
        }
        wanted = self._policy.choose(list(candidates))
        wanted |= {v for v in wanted_labels.values() if v in candidates}
        current = self._loaded
        updated = {v: current[v] for v in wanted if v in current}
        new = []
        for version in sorted(wanted - set(updated)):
            self._states[version] = VersionState("LOADING")
            try:
                updated[version] = load_version(version, candidates[version])
                new.append(version)
                self._states[version] = VersionState("AVAILABLE")
            except Exception as exc:  # noqa: BLE001 - a bad version must not stop serving the good one
                self._failed.add(version)
                code = exc.code if isinstance(exc, StatusError) else "UNKNOWN"
                self._states[version] = VersionState("END", code, str(exc).strip()[:2000])
                log.error(
                    "version %s in %s cannot be served, skipped: %s",
                    version,
                    self.serving_dir,
                    exc,
                )
        if not updated and current:
            return []  # nothing loadable now (e.g. the folder was emptied): keep serving
        self._loaded = dict(sorted(updated.items()))  # the switch: one assignment
        for version in set(current) - set(updated):
            self._states[version] = VersionState("END")
        self._labels = wanted_labels
        return new

    def resolve(
        self, name: str, *, version: int | None = None, label: str | None = None
    ) -> LoadedVersion:
        """The loaded version a model spec asks for, or TF Serving's error for it."""
        if not name:
            raise invalid_argument("ModelSpec has no name specified.")
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

    def status(self, name: str, *, version: int | None = None) -> Any:
        """TF Serving's GetModelStatusResponse: every version seen (newest first), or one.

        A version label in the request is not looked at: TF Serving's GetModelStatus reads the
        model spec's version only (get_model_status_impl.cc), so a label lists every version.
        """
        from tensorflow_serving.apis import get_model_status_pb2

        states = dict(self._states)
        if name != self.model_name or not states:
            raise not_found(f"Could not find any versions of model {name}")
        if version is not None and version not in states:
            raise not_found(f"Could not find version {version} of model {name}")
        versions = sorted(states, reverse=True) if version is None else [version]
        response = get_model_status_pb2.GetModelStatusResponse()
        state_enum = get_model_status_pb2.ModelVersionStatus.State
        for number in versions:
            entry = response.model_version_status.add()
            entry.version = number
            entry.state = state_enum.Value(states[number].state)
            entry.status.error_code = _error_code(states[number].error_code)
            entry.status.error_message = states[number].error_message
        return response


def _error_code(name: str) -> int:
    from tensorflow.core.protobuf import error_codes_pb2

    return error_codes_pb2.Code.Value(name)


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
    response.metadata[SIGNATURE_DEF_FIELD].Pack(signature_map)
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
    """Runs a signature on named input arrays (already typed by `input_dtypes`).

    The checks and messages are TF Serving's predict_util.cc (input count, output filter) and
    TensorFlow's saved_model/util.cc GetInputValues (input names); outputs come in the order
    the filter names them.
    """
    signature_def, function = loaded.signature(signature_name)
    expected = set(signature_def.inputs)
    sent = set(inputs)
    if len(sent) != len(expected):
        raise invalid_argument(
            f"input size does not match signature: {len(sent)}!={len(expected)} "
            f"len({{{_joined(sent)}}}) != len({{{_joined(expected)}}}). "
            f"Sent extra: {{{_joined(sent - expected)}}}. "
            f"Missing but required: {{{_joined(expected - sent)}}}."
        )
    missing = sorted(expected - sent)
    if missing:  # as many inputs as the signature has, but not the same names
        alias = missing[0]
        raise invalid_argument(
            f"Signature input alias: {alias}(feed name: {signature_def.inputs[alias].name}) not "
            f"found in request and no default value provided. Inputs expected to be in the "
            f"request {{{_joined(sent)}}}, or default input alias set: "
        )
    seen: set[str] = set()
    for alias in output_filter:
        if alias not in signature_def.outputs:
            raise invalid_argument(
                f"output tensor alias not found in signature: {alias} Outputs expected to be in "
                f"the set {{{_joined(signature_def.outputs)}}}."
            )
        if alias in seen:
            raise invalid_argument(f"duplicate output tensor alias: {alias}")
        seen.add(alias)
    for name, value in inputs.items():
        _check_shape(name, np.shape(value), signature_def.inputs[name].tensor_shape)
    keywords = loaded.keywords.get(signature_name or DEFAULT_SIGNATURE, {})
    outputs = _run(function, {keywords.get(name, name): value for name, value in inputs.items()})
    if output_filter:
        outputs = {name: outputs[name] for name in output_filter}
    return outputs


def _check_shape(name: str, shape: tuple[int, ...], declared: Any) -> None:
    """Refuses an input whose shape the signature does not take, naming both shapes (TF
    Serving leaves this to the graph, whose kernel then refuses it in its own words)."""
    if declared.unknown_rank:
        return
    sizes = [dim.size for dim in declared.dim]
    fits = len(shape) == len(sizes) and all(
        want < 0 or want == got for want, got in zip(sizes, shape, strict=True)
    )
    if not fits:
        shown = ",".join("?" if size < 0 else str(size) for size in sizes)
        raise invalid_argument(
            f"input {name} has shape [{','.join(map(str, shape))}]; the signature takes [{shown}]"
        )


def _joined(names: Any) -> str:
    """Names as TF Serving prints a set of them: sorted, comma-separated (absl::StrJoin)."""
    return ",".join(sorted(names))


def input_dtypes(
    loaded: LoadedVersion, signature_name: str, *, rest: bool = False
) -> dict[str, int]:
    """Signature input key -> TensorFlow DataType enum (what a JSON value must be converted to).

    `rest`: TF Serving's REST handler looks the signature up itself and refuses an unknown
    one with INVALID_ARGUMENT (http_rest_api_handler.cc GetInfoMap); gRPC's predictor answers
    FAILED_PRECONDITION (predict_util.cc).
    """
    key = signature_name or DEFAULT_SIGNATURE
    if rest and key not in loaded.signature_defs:
        raise invalid_argument(f'Serving signature name: "{key}" not found in signature def')
    signature_def, _ = loaded.signature(signature_name)
    return {key: info.dtype for key, info in signature_def.inputs.items()}


def _method_signature(
    loaded: LoadedVersion, signature_name: str, method: str, *, not_found_text: str
) -> tuple[Any, Any]:
    """The SignatureDef and function of a classification or regression signature, with TF
    Serving's checks (classifier.cc and regressor.cc: GetClassificationSignatureDef,
    PreProcessClassification, PreProcessRegression)."""
    key = signature_name or DEFAULT_SIGNATURE
    if key not in loaded.functions:
        raise invalid_argument(f"{not_found_text}{key}")
    signature_def, function = loaded.signature(key)
    if signature_def.method_name != method:
        kind = "classification" if method == CLASSIFY_METHOD else "regression"
        raise invalid_argument(
            f"Expected {kind} signature method_name to be {method}. Was: "
            f"{signature_def.method_name}"
        )
    if len(signature_def.inputs) != 1:
        raise invalid_argument("Expected one input Tensor.")
    outputs = signature_def.outputs
    if method == CLASSIFY_METHOD:
        if len(outputs) not in (1, 2):
            raise invalid_argument(f"Expected one or two output Tensors, found {len(outputs)}")
        if CLASSIFY_OUTPUT_CLASSES not in outputs and CLASSIFY_OUTPUT_SCORES not in outputs:
            raise failed_precondition(
                "Expected classification signature outputs to contain at least one of "
                f'"{CLASSIFY_OUTPUT_CLASSES}" or "{CLASSIFY_OUTPUT_SCORES}". Signature was: '
                f"{signature_def}"
            )
    else:
        if len(outputs) != 1:
            raise invalid_argument("Expected one output Tensor.")
        if REGRESS_OUTPUTS not in outputs:
            raise failed_precondition(
                f"No regression outputs found in SignatureDef: {signature_def}"
            )
    return signature_def, function


# classifier.cc and regressor.cc (GetClassificationSignatureDef, GetRegressionSignatureDef).
_SIGNATURE_NOT_FOUND = "No signature was found with the name: "


def classify(
    loaded: LoadedVersion, signature_name: str, examples: Sequence[bytes]
) -> list[list[tuple[str, float]]]:
    """TF Serving's Classify: (label, score) pairs per serialized tf.Example."""
    signature_def, function = _method_signature(
        loaded, signature_name, CLASSIFY_METHOD, not_found_text=_SIGNATURE_NOT_FOUND
    )
    return _classify_with(signature_def, function, examples)


def _classify_with(
    signature_def: Any, function: Any, examples: Sequence[bytes]
) -> list[list[tuple[str, float]]]:
    if not examples:
        raise invalid_argument("Input is empty.")
    (input_key,) = signature_def.inputs
    result = _run(function, {input_key: np.array(list(examples), dtype=object)})
    classes = result.get(CLASSIFY_OUTPUT_CLASSES)
    scores = result.get(CLASSIFY_OUTPUT_SCORES)
    batch = len(examples)
    for name, tensor in ((CLASSIFY_OUTPUT_CLASSES, classes), (CLASSIFY_OUTPUT_SCORES, scores)):
        if tensor is None:
            continue
        if tensor.ndim != 2:
            raise invalid_argument(
                f"Expected Tensor shape: [batch_size num_classes] but got {list(tensor.shape)}"
            )
        if tensor.shape[0] != batch:
            raise invalid_argument(
                f"Expected {name} output batch size of {batch}. Got: {tensor.shape[0]}"
            )
    width = (scores if scores is not None else classes).shape[1]
    return [
        [
            (
                classes[i, j].decode("utf-8", "replace") if classes is not None else "",
                float(scores[i, j]) if scores is not None else 0.0,
            )
            for j in range(width)
        ]
        for i in range(batch)
    ]


def regress(loaded: LoadedVersion, signature_name: str, examples: Sequence[bytes]) -> list[float]:
    """TF Serving's Regress: one value per serialized tf.Example."""
    signature_def, function = _method_signature(
        loaded, signature_name, REGRESS_METHOD, not_found_text=_SIGNATURE_NOT_FOUND
    )
    return _regress_with(signature_def, function, examples)


def _regress_with(signature_def: Any, function: Any, examples: Sequence[bytes]) -> list[float]:
    if not examples:
        raise invalid_argument("Input is empty.")
    (input_key,) = signature_def.inputs
    values = _run(function, {input_key: np.array(list(examples), dtype=object)})[REGRESS_OUTPUTS]
    batch = len(examples)
    if values.shape not in ((batch,), (batch, 1)):
        raise invalid_argument(
            "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
            f"{list(values.shape)}"
        )
    return [float(v) for v in values.reshape(-1)]


@dataclass(frozen=True)
class InferenceTask:
    """One task of a MultiInference request: a signature and the method to run it with."""

    signature_name: str
    method_name: str


def multi_inference(
    loaded: LoadedVersion, tasks: Sequence[InferenceTask], examples: Sequence[bytes]
) -> list[tuple[InferenceTask, Any]]:
    """TF Serving's MultiInference on one version: every task over the same examples.

    Checks and messages are multi_inference.cc's (duplicate signature, signature not found,
    unsupported method, the classifier's and regressor's signature checks), all before
    anything runs. Returns (task, classification rows or regression values) in task order.

    TF Serving's session runner also requires every task's input to be the same graph tensor
    ("Input tensor must be the same for all Signatures."): in a TensorFlow 2 SavedModel each
    signature has its own input placeholder, so that check would refuse any two signatures of
    such a model. Here each task's signature runs on the same serialized examples instead.
    """
    checked = []
    seen: set[str] = set()
    for task in tasks:
        key = task.signature_name or DEFAULT_SIGNATURE
        if key in seen:
            raise invalid_argument(f"Duplicate evaluation of signature: {key}")
        seen.add(key)
        if task.method_name not in (CLASSIFY_METHOD, REGRESS_METHOD):
            if key not in loaded.signature_defs:
                raise invalid_argument(f"Requested signature not found in model graph: {key}")
            raise StatusError(
                "UNIMPLEMENTED", f"Unsupported signature method_name: {task.method_name}"
            )
        signature_def, function = _method_signature(
            loaded,
            key,
            task.method_name,
            not_found_text="Requested signature not found in model graph: ",
        )
        checked.append((task, signature_def, function))
    if not examples:
        raise invalid_argument("Input is empty.")
    results = []
    for task, signature_def, function in checked:
        if task.method_name == CLASSIFY_METHOD:
            results.append((task, _classify_with(signature_def, function, examples)))
        else:
            results.append((task, _regress_with(signature_def, function, examples)))
    return results


def merge_context(context: bytes | None, examples: Sequence[bytes]) -> list[bytes]:
    """ExampleListWithContext -> serialized examples, as TF Serving builds them.

    Concatenating two serialized messages merges them (a feature in the example replaces the
    context's feature of the same name), which is how TF Serving joins them.
    """
    if not context:
        return list(examples)
    return [context + example for example in examples]


LabelSource = Callable[[], Mapping[str, int]]
