"""The serving contract, in one module.

An exported fullthrottle model is a SavedModel with the Transform graph inside, so clients send
raw features, and three signatures:

- ``serving_default``: a batch of serialized ``tf.Example`` (string ``[None]`` named
  ``examples``) -> ``probabilities`` float32 ``[None, num_classes]`` and ``classes`` string
  ``[None]`` (the most likely class name). The shape is what TF Serving's request batching and
  TFMA's Evaluator expect.
- ``classification``: TF Serving's classification signature (method
  ``tensorflow/serving/classify``, for ``:classify`` and gRPC ``Classify``): serialized
  ``tf.Example`` (``inputs``) -> ``classes`` string ``[None, num_classes]`` (every class name)
  and ``scores`` float32 ``[None, num_classes]`` (their probabilities).
- ``predict_raw``: one named tensor ``[None]`` per raw feature (for JSON requests) -> the same
  outputs. Every feature must be sent. Its inputs are named exactly as the columns are (``a b``,
  ``od280/od315``, ``温度``): TensorFlow only saves signature arguments named like graph nodes and
  Python parameters, so the function is traced with each column's internal name
  (`fullthrottle.core.features.internal_name`) and the SignatureDef's input keys (what TF Serving
  and ``fullthrottle serve`` match JSON keys against) are renamed to the column names after
  saving. In Python, a loaded model's ``signatures["predict_raw"]`` still takes the internal
  names as keyword arguments (TensorFlow's calling convention); `signature_input_specs` and
  `call_signature` work with the column names. Columns whose names are already safe (lowercase
  ASCII letters, digits, ``_``) are the same in both.
- ``raw_input_names`` (a function, not a signature): which column each internal name stands for.
- ``transform_features``: serialized ``tf.Example`` (label included) -> the transformed features,
  used by the Evaluator to obtain the label.
- ``predict_transformed``: the transformed features (what ``transform_features`` returns, label
  excluded) -> ``probabilities``. The model alone, without the Transform graph: this is what the
  TFLite export converts, because the Transform graph's string ops (``StringToHashBucketFast``,
  ``SparseToDense``) need the Flex delegate, which TFLite interpreters usually lack.

The model runs in float32 whatever precision it was trained in (mixed-float16 SavedModels are
slow on CPU servers); the trainer hands over a float32 copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf
import tensorflow_transform as tft

from fullthrottle.core.features import (
    LABEL_VOCAB,
    internal_name,
    raw_input_keywords,
    transformed_name,
)

SERVING_DEFAULT = "serving_default"
CLASSIFICATION = "classification"
PREDICT_RAW = "predict_raw"
TRANSFORM_FEATURES = "transform_features"
PREDICT_TRANSFORMED = "predict_transformed"
EXAMPLES_INPUT = "examples"


def raw_serving_spec(
    tft_output: tft.TFTransformOutput, label: str, features: Sequence[str] | None = None
) -> dict[str, tf.io.FixedLenFeature]:
    """The raw feature spec a client sends: the raw features the model uses (`features`, the
    data spec's feature columns), else every raw feature of the schema; never the label.

    Columns the schema has but the model ignores (an id, a year) are not asked of clients: the
    Transform layer only reads the columns `preprocessing_fn` uses."""
    spec = dict(tft_output.raw_feature_spec())
    spec.pop(label, None)
    if features is not None:
        spec = {name: feature for name, feature in spec.items() if name in set(features)}
    return spec


class ServingModule(tf.Module):
    """Holds the model, the Transform layer and the class names, and defines the signatures."""

    def __init__(
        self,
        model: keras.Model,
        tft_output: tft.TFTransformOutput,
        label: str,
        features: Sequence[str] | None = None,
    ) -> None:
        super().__init__(name="fullthrottle_serving")
        self.model = model
        self.tft_layer = tft_output.transform_features_layer()
        self._raw_spec = raw_serving_spec(tft_output, label, features)
        self._full_raw_spec = dict(tft_output.raw_feature_spec())
        transformed_label = transformed_name(label)
        self._transformed_spec = {
            name: feature
            for name, feature in tft_output.transformed_feature_spec().items()
            if name != transformed_label
        }
        class_names = [
            c.decode("utf-8") if isinstance(c, bytes) else str(c)
            for c in tft_output.vocabulary_by_name(LABEL_VOCAB)
        ]
        self.class_names = tf.constant(class_names, dtype=tf.string)
        self.num_classes = len(class_names)
        # Saved with the model: which column each internal predict_raw argument stands for.
        columns = sorted(self._raw_spec)
        internal = [internal_name(column) for column in columns]

        @tf.function(input_signature=[])
        def raw_input_names() -> dict[str, tf.Tensor]:
            return {
                "internal": tf.constant(internal, dtype=tf.string, shape=[len(internal)]),
                "column": tf.constant(columns, dtype=tf.string, shape=[len(columns)]),
            }

        self.raw_input_names = raw_input_names

    @property
    def raw_input_columns(self) -> tuple[str, ...]:
        """The columns `predict_raw` takes, as the user named them."""
        return tuple(sorted(self._raw_spec))

    def _predict(self, raw_features: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        transformed = self.tft_layer(dict(raw_features))
        probabilities = tf.cast(self.model(transformed, training=False), tf.float32)
        classes = tf.gather(self.class_names, tf.argmax(probabilities, axis=-1))
        return {"probabilities": probabilities, "classes": classes}

    def signatures(self) -> dict[str, tf.types.experimental.ConcreteFunction]:
        raw_spec = self._raw_spec
        full_spec = self._full_raw_spec

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=EXAMPLES_INPUT)])
        def serve_examples(examples: tf.Tensor) -> dict[str, tf.Tensor]:
            return self._predict(tf.io.parse_example(examples, raw_spec))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=EXAMPLES_INPUT)])
        def transform_features(examples: tf.Tensor) -> dict[str, tf.Tensor]:
            return self.tft_layer(tf.io.parse_example(examples, full_spec))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def classification(inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            scores = self._predict(tf.io.parse_example(inputs, raw_spec))["probabilities"]
            classes = tf.tile(self.class_names[tf.newaxis, :], [tf.shape(scores)[0], 1])
            return {"classes": classes, "scores": scores}

        raw_signature = {
            name: tf.TensorSpec([None], feature.dtype, name=internal_name(name))
            for name, feature in raw_spec.items()
        }

        @tf.function(input_signature=[raw_signature])
        def predict_raw(features: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            return self._predict(_to_parsed_form(features, raw_spec))

        transformed_signature = {
            name: tf.TensorSpec([None, *feature.shape], feature.dtype, name=name)
            for name, feature in self._transformed_spec.items()
        }

        @tf.function(input_signature=[transformed_signature])
        def predict_transformed(features: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            return {
                "probabilities": tf.cast(self.model(dict(features), training=False), tf.float32)
            }

        return {
            SERVING_DEFAULT: serve_examples.get_concrete_function(),
            CLASSIFICATION: classification.get_concrete_function(),
            PREDICT_RAW: predict_raw.get_concrete_function(),
            TRANSFORM_FEATURES: transform_features.get_concrete_function(),
            PREDICT_TRANSFORMED: predict_transformed.get_concrete_function(),
        }


def signature_keywords(loaded: object, signature: str) -> dict[str, str]:
    """SignatureDef input key -> the keyword the loaded signature function takes, where they
    differ: `predict_raw`'s columns whose names are not safe inside TensorFlow (see
    `fullthrottle.core.features.internal_name`). Empty for any other signature or model."""
    if signature != PREDICT_RAW:
        return {}
    return raw_input_keywords(loaded)


def signature_input_specs(loaded: object, signature: str) -> dict[str, tf.TensorSpec]:
    """The inputs of `signature` in a loaded SavedModel (name -> TensorSpec), named as its
    SignatureDef (and so TF Serving) names them: `predict_raw`'s by the columns as written."""
    concrete = loaded.signatures[signature]  # type: ignore[attr-defined]
    specs = dict(concrete.structured_input_signature[1])
    keywords = signature_keywords(loaded, signature)
    if not keywords:
        return specs
    by_keyword = {keyword: column for column, keyword in keywords.items()}
    return {by_keyword.get(name, name): spec for name, spec in specs.items()}


def call_signature(loaded: object, signature: str, inputs: Mapping[str, object]) -> dict:
    """Calls a loaded signature with inputs keyed as its SignatureDef names them."""
    keywords = signature_keywords(loaded, signature)
    function = loaded.signatures[signature]  # type: ignore[attr-defined]
    return function(**{keywords.get(name, name): value for name, value in inputs.items()})


def raw_inputs_from_examples(
    serialized: list[bytes], input_specs: Mapping[str, tf.TensorSpec]
) -> dict[str, np.ndarray]:
    """Named raw-feature arrays (the `predict_raw` inputs) for a batch of serialized tf.Examples.

    A missing numeric value becomes NaN (the Transform graph imputes it, as it does for a
    missing cell in a tf.Example); a missing string becomes the empty string.
    """
    columns: dict[str, list] = {name: [] for name in input_specs}
    for record in serialized:
        features = tf.train.Example.FromString(record).features.feature
        for name, spec in input_specs.items():
            feature = features.get(name)
            values = _feature_values(feature)
            if spec.dtype == tf.string:
                value = values[0] if values else b""
                columns[name].append(value if isinstance(value, bytes) else str(value).encode())
            else:
                columns[name].append(values[0] if values else float("nan"))
    arrays = {}
    for name, spec in input_specs.items():
        if spec.dtype == tf.string:
            arrays[name] = np.array(columns[name], dtype=object)
        elif spec.dtype.is_integer:
            # An integer input cannot hold NaN: a missing integer is sent as 0.
            arrays[name] = np.array(
                [0 if _is_nan(v) else int(v) for v in columns[name]],
                dtype=spec.dtype.as_numpy_dtype,
            )
        else:
            arrays[name] = np.array(columns[name], dtype=spec.dtype.as_numpy_dtype)
    return arrays


def _feature_values(feature: object) -> list:
    if feature is None:
        return []
    for kind in ("float_list", "int64_list", "bytes_list"):
        values = list(getattr(feature, kind).value)
        if values:
            return values
    return []


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and value != value


def _to_parsed_form(
    features: Mapping[str, tf.Tensor], spec: Mapping[str, object]
) -> dict[str, tf.Tensor]:
    """Shapes named [None] tensors the way `tf.io.parse_example` would have for `spec`."""
    parsed = {}
    for name, feature in spec.items():
        value = features[name]
        if isinstance(feature, tf.io.VarLenFeature):
            batch = tf.shape(value, out_type=tf.int64)[0]
            indices = tf.stack([tf.range(batch), tf.zeros([batch], tf.int64)], axis=1)
            parsed[name] = tf.SparseTensor(
                indices, value, tf.stack([batch, tf.constant(1, tf.int64)])
            )
        elif isinstance(feature, tf.io.FixedLenFeature) and len(feature.shape) == 1:
            parsed[name] = tf.reshape(value, [-1, feature.shape[0]])
        else:
            parsed[name] = value
    return parsed


def export_serving_model(
    model: keras.Model,
    *,
    tft_output: tft.TFTransformOutput,
    label: str,
    export_dir: str,
    features: Sequence[str] | None = None,
) -> None:
    """Writes the SavedModel with all signatures to `export_dir` (which must not exist yet)."""
    module = ServingModule(model, tft_output, label, features)
    tf.saved_model.save(module, export_dir, signatures=module.signatures())
    renamed = {
        internal_name(column): column
        for column in module.raw_input_columns
        if internal_name(column) != column
    }
    finish_signatures(
        export_dir, methods={CLASSIFICATION: CLASSIFY_METHOD}, input_names={PREDICT_RAW: renamed}
    )


CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"


def set_signature_methods(export_dir: str, methods: Mapping[str, str]) -> None:
    """Marks signatures as TF Serving classification or regression signatures."""
    finish_signatures(export_dir, methods=methods)


def finish_signatures(
    export_dir: str,
    *,
    methods: Mapping[str, str],
    input_names: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """What `tf.saved_model.save` cannot write, set in saved_model.pb after saving.

    `methods` (signature -> method name) marks TF Serving classification or regression
    signatures: TF Serving classifies or regresses only with a signature whose `method_name` says
    so, and `tf.saved_model.save` writes every signature as a predict one. TensorFlow's loader
    ignores method names: the model loads as before.

    `input_names` (signature -> {traced argument name: name clients use}) renames the
    SignatureDef's input keys: what TF Serving (and `fullthrottle serve`) match request keys
    against. The tensors, and so the graph, stay as they are, and so does the loaded signature
    function's calling convention: TensorFlow calls it with the traced names (keyword arguments
    are sanitized into Python names, and `a b`, `a-b` and `a_b` would collide there);
    `signature_keywords` maps one to the other.

    The file is written to a temporary file and renamed over saved_model.pb.
    """
    import os

    from tensorflow.core.protobuf import saved_model_pb2

    path = os.path.join(export_dir, "saved_model.pb")
    saved_model = saved_model_pb2.SavedModel()
    with open(path, "rb") as file:
        saved_model.ParseFromString(file.read())
    for meta_graph in saved_model.meta_graphs:
        for name, method in methods.items():
            if name not in meta_graph.signature_def:
                raise KeyError(f"{export_dir} has no signature {name!r} to mark as {method}")
            meta_graph.signature_def[name].method_name = method
        for name, renames in (input_names or {}).items():
            if renames:
                _rename_signature_inputs(meta_graph, name, renames)
    temporary = path + ".tmp"
    with open(temporary, "wb") as file:
        file.write(saved_model.SerializeToString())
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def _rename_signature_inputs(
    meta_graph: object, signature: str, renames: Mapping[str, str]
) -> None:
    """Renames the input keys of one SignatureDef in a MetaGraphDef (see `finish_signatures`)."""
    signature_def = meta_graph.signature_def[signature]  # type: ignore[attr-defined]
    inputs = dict(signature_def.inputs)
    missing = sorted(set(renames) - set(inputs))
    if missing:
        raise KeyError(f"signature {signature!r} has no input(s) {missing} to rename")
    for key in inputs:
        del signature_def.inputs[key]
    for key, tensor_info in inputs.items():
        signature_def.inputs[renames.get(key, key)].CopyFrom(tensor_info)
