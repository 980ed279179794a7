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
  outputs. Every feature must be sent; a missing value is ``NaN`` (numbers) or ``""`` (text and
  categories), which the model reads as the CSV's empty cell. Its inputs are named exactly as the columns are (``a b``,
  ``od280/od315``, ``温度``): TensorFlow only saves signature arguments named like graph nodes and
  Python parameters, so the function is traced with each column's internal name
  (`fullthrottle.core.features.internal_name`) and the SignatureDef's input keys (what TF Serving
  and ``fullthrottle serve`` match JSON keys against) are renamed to the column names after
  saving. In Python, a loaded model's ``signatures["predict_raw"]`` still takes the internal
  names as keyword arguments (TensorFlow's calling convention); `signature_input_specs` and
  `call_signature` work with the column names. Columns whose names are already safe (lowercase
  ASCII letters, digits, ``_``) are the same in both.
- For a regression model (``data.task: regression``) the outputs are numbers instead:
  ``serving_default``, ``predict_raw`` and ``predict_transformed`` answer ``predictions`` float32
  ``[None]``, and instead of ``classification`` there is ``regression``: TF Serving's regression
  signature (method ``tensorflow/serving/regress``, for ``:regress`` and gRPC ``Regress``):
  serialized ``tf.Example`` (``inputs``) -> ``outputs`` float32 ``[None]``.
- ``raw_input_names`` (a function, not a signature): which column each internal name stands for.
- ``transform_features``: serialized ``tf.Example`` (label included) -> the transformed features,
  used by the Evaluator to obtain the label.
- ``predict_transformed``: the transformed features (what ``transform_features`` returns, label
  excluded) -> ``probabilities``. The model alone, without the Transform graph: this is what the
  TFLite export converts, because the Transform graph's string ops (``StringToHashBucketFast``,
  ``SparseToDense``) need the Flex delegate, which TFLite interpreters usually lack.

A numeric column (``data.numeric``) is a number, whatever its training sample held: its
``predict_raw`` input is float32, and the signatures that read ``tf.Example`` take its value as a
``float_list`` or an ``int64_list`` alike (``215`` and ``215.0``; TF Serving's JSON makes the
first an ``int64_list``). They read it with ``tf.io.decode_proto`` (`parse_raw_examples`), since
``tf.io.parse_example`` refuses the other kind. Should the Transform read the column as int64
(TFRecord data with ``int64_list`` values), a whole number is converted and a fractional one
refused, naming the column. Other columns keep the schema's type (an integer category stays
int64).

The model runs in float32 whatever precision it was trained in (mixed-float16 SavedModels are
slow on CPU servers); the trainer hands over a float32 copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
REGRESSION = "regression"
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
        numeric: Sequence[str] = (),
        task: str = "classification",
    ) -> None:
        super().__init__(name="fullthrottle_serving")
        self.model = model
        self.regression = task == "regression"
        self.tft_layer = tft_output.transform_features_layer()
        self._raw_spec = raw_serving_spec(tft_output, label, features)
        # The numeric columns `predict_raw` takes as float32 and tf.Examples may carry as either
        # number kind.
        self._numeric = tuple(
            name for name in numeric if _is_number_feature(self._raw_spec.get(name))
        )
        self._full_raw_spec = dict(tft_output.raw_feature_spec())
        transformed_label = transformed_name(label)
        self._transformed_spec = {
            name: feature
            for name, feature in tft_output.transformed_feature_spec().items()
            if name != transformed_label
        }
        class_names = (
            []
            if self.regression
            else [
                c.decode("utf-8") if isinstance(c, bytes) else str(c)
                for c in tft_output.vocabulary_by_name(LABEL_VOCAB)
            ]
        )
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

    def parse_raw_examples(self, serialized: tf.Tensor) -> dict[str, Any]:
        """The raw features of serialized tf.Examples, as `tf.io.parse_example` gives them for
        the raw spec, numeric columns read from either number kind. For every signature that
        takes tf.Examples."""
        return parse_raw_examples(serialized, self._raw_spec, numeric=self._numeric)

    def _model_outputs(self, transformed: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """The model on transformed features: ``probabilities``, or ``predictions`` [None]."""
        outputs = tf.cast(self.model(dict(transformed), training=False), tf.float32)
        if self.regression:
            return {"predictions": tf.reshape(outputs, [-1])}
        return {"probabilities": outputs}

    def _predict(self, raw_features: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        transformed = self.tft_layer(dict(raw_features))
        if self.regression:
            return self._model_outputs(transformed)
        probabilities = self._model_outputs(transformed)["probabilities"]
        classes = tf.gather(self.class_names, tf.argmax(probabilities, axis=-1))
        return {"probabilities": probabilities, "classes": classes}

    def signatures(self) -> dict[str, tf.types.experimental.ConcreteFunction]:
        raw_spec = self._raw_spec
        full_spec = self._full_raw_spec

        # serving_default and the classify (or regress) signature answer the same tf.Examples:
        # one function, traced once, that both call. Its graph (the tf.Example parsing with a
        # few hundred ops per numeric column, Transform, the model) is then in the SavedModel
        # once, not twice: faster to export and to load.
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def predict_examples(examples: tf.Tensor) -> dict[str, tf.Tensor]:
            return self._predict(self.parse_raw_examples(examples))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=EXAMPLES_INPUT)])
        def serve_examples(examples: tf.Tensor) -> dict[str, tf.Tensor]:
            return predict_examples(examples)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=EXAMPLES_INPUT)])
        def transform_features(examples: tf.Tensor) -> dict[str, tf.Tensor]:
            return self.tft_layer(tf.io.parse_example(examples, full_spec))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def regression(inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"outputs": predict_examples(inputs)["predictions"]}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def classification(inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            scores = predict_examples(inputs)["probabilities"]
            classes = tf.tile(self.class_names[tf.newaxis, :], [tf.shape(scores)[0], 1])
            return {"classes": classes, "scores": scores}

        numeric = self._numeric
        raw_signature = {
            name: tf.TensorSpec(
                [None], tf.float32 if name in numeric else feature.dtype, name=internal_name(name)
            )
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
            return self._model_outputs(features)

        task_signature = (
            {REGRESSION: regression.get_concrete_function()}
            if self.regression
            else {CLASSIFICATION: classification.get_concrete_function()}
        )
        return {
            SERVING_DEFAULT: serve_examples.get_concrete_function(),
            **task_signature,
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
    """Shapes named [None] tensors the way `tf.io.parse_example` would have for `spec`.

    A missing value (NaN in a float tensor, "" in a string one) is left out, as a CSV's empty
    cell is left out of its tf.Example; a feature the spec requires is then refused with
    `tf.io.parse_example`'s words. A float sent for an int64 feature must be a whole number.
    """
    parsed = {}
    for name, feature in spec.items():
        value = features[name]
        if not _is_scalar_feature(feature):
            parsed[name] = value
            continue
        batch = tf.shape(value, out_type=tf.int64)[0]
        rows = tf.range(batch)
        if value.dtype.is_floating:
            present = tf.logical_not(tf.math.is_nan(value))
        elif value.dtype == tf.string:
            present = tf.not_equal(value, "")
        else:
            present = tf.ones([batch], tf.bool)
        value = _as_feature_dtype(value, feature.dtype, name)
        parsed[name] = _from_present_values(
            name,
            feature,
            rows=tf.boolean_mask(rows, present),
            values=tf.boolean_mask(value, present),
            batch=batch,
        )
    return parsed


def _type_name(dtype: tf.DType) -> str:
    """TensorFlow's DataTypeString, as parse_example's messages write it ("float", "int64")."""
    from tensorflow.core.framework import types_pb2

    return types_pb2.DataType.Name(dtype.as_datatype_enum).removeprefix("DT_").lower()


def _is_scalar_feature(feature: object) -> bool:
    """A VarLenFeature, or a FixedLenFeature of one value per example."""
    if isinstance(feature, tf.io.VarLenFeature):
        return True
    return isinstance(feature, tf.io.FixedLenFeature) and list(feature.shape) in ([], [1])


def _is_number_feature(feature: object) -> bool:
    return _is_scalar_feature(feature) and (
        feature.dtype.is_floating or feature.dtype.is_integer  # type: ignore[union-attr]
    )


def _as_feature_dtype(values: tf.Tensor, dtype: tf.DType, name: str) -> tf.Tensor:
    """`values` as the feature's dtype: a float for an int64 feature must be a whole number."""
    if values.dtype == dtype:
        return values
    if values.dtype.is_floating and dtype.is_integer:
        finite = tf.boolean_mask(values, tf.logical_not(tf.math.is_nan(values)))
        whole = tf.reduce_all(tf.equal(finite, tf.round(finite)))
        check = tf.debugging.Assert(
            whole,
            [
                f"Feature: {name} takes whole numbers here (the model reads it as int64, as its "
                "training data held int64 values); send an integer"
            ],
        )
        with tf.control_dependencies([check]):
            return tf.cast(values, dtype)
    return tf.cast(values, dtype)


def _from_present_values(
    name: str, feature: object, *, rows: tf.Tensor, values: tf.Tensor, batch: tf.Tensor
) -> Any:
    """The parsed form of a feature from its present values and the rows they belong to
    (rows ascending): a SparseTensor for a VarLenFeature, a dense tensor for a
    FixedLenFeature (its default where a row has no value; refused where it has none)."""
    if isinstance(feature, tf.io.VarLenFeature):
        counts = tf.math.unsorted_segment_sum(tf.ones_like(rows), rows, num_segments=batch)
        positions = tf.range(tf.size(rows, out_type=tf.int64)) - tf.gather(
            tf.cumsum(counts, exclusive=True), rows
        )
        width = tf.maximum(tf.reduce_max(tf.concat([counts, [0]], 0)), 0)
        return tf.SparseTensor(
            tf.stack([rows, positions], axis=1), values, tf.stack([batch, width])
        )
    # FixedLenFeature of shape [] or [1]: one value per row.
    present = tf.scatter_nd(
        tf.expand_dims(rows, 1), tf.ones_like(rows, dtype=tf.bool), tf.expand_dims(batch, 0)
    )
    filled = tf.scatter_nd(tf.expand_dims(rows, 1), values, tf.expand_dims(batch, 0))
    if feature.default_value is None:
        check = tf.debugging.Assert(
            tf.reduce_all(present),
            [
                f"Feature: {name} (data type: {_type_name(feature.dtype)}) is required but could not be found."
            ],
        )
        with tf.control_dependencies([check]):
            filled = tf.identity(filled)
    else:
        default = tf.reshape(tf.constant(feature.default_value, feature.dtype), [-1])[0]
        filled = tf.where(present, filled, default)
    return tf.reshape(filled, [-1, *feature.shape])


def parse_raw_examples(
    serialized: tf.Tensor, spec: Mapping[str, object], *, numeric: Sequence[str]
) -> dict[str, Any]:
    """`tf.io.parse_example(serialized, spec)`, except that the `numeric` features may hold a
    float_list or an int64_list in any example (see the module docstring)."""
    numeric = [name for name in numeric if name in spec]
    others = {name: feature for name, feature in spec.items() if name not in numeric}
    parsed = dict(tf.io.parse_example(serialized, others)) if others else {}
    if not numeric:
        return parsed
    batch = tf.shape(serialized, out_type=tf.int64)[0]
    entries_rows, keys, values = _feature_entries(serialized)
    for name in numeric:
        feature = spec[name]
        mine = _last_of_each_row(tf.equal(keys, name), entries_rows, batch)
        rows, numbers = _numbers_of(
            tf.boolean_mask(values, mine),
            tf.boolean_mask(entries_rows, mine),
            dtype=feature.dtype,
            name=name,
        )
        parsed[name] = _from_present_values(name, feature, rows=rows, values=numbers, batch=batch)
    return parsed


def _last_of_each_row(mine: tf.Tensor, rows: tf.Tensor, batch: tf.Tensor) -> tf.Tensor:
    """`mine` kept only at each row's last entry: a feature named twice in one serialized
    tf.Example (a context merged with an example, as TF Serving joins them) is the last one,
    as protobuf merges map entries and `tf.io.parse_example` reads them."""
    index = tf.range(tf.size(rows, out_type=tf.int64))
    marked = tf.where(mine, index, -1)
    last = tf.math.unsorted_segment_max(marked, rows, num_segments=batch)
    return tf.logical_and(mine, tf.equal(index, tf.gather(last, rows)))


def _decoded(serialized: tf.Tensor, message: str, fields: list[str], types: list) -> Any:
    """`tf.io.decode_proto` with TensorFlow's own descriptors (tf.Example is built in), on
    any number of messages: the op refuses an empty batch, so one empty message is decoded
    along and dropped."""
    sizes, values = tf.io.decode_proto(
        tf.concat([serialized, [b""]], axis=0),
        message,
        fields,
        types,
        descriptor_source="local://",
    )
    return sizes[:-1], [value[:-1] for value in values]


def _feature_entries(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Every (example row, feature name, serialized Feature) of a batch of tf.Examples."""
    # A tf.Example is one field, `features` (number 1). A serialized example may carry it more
    # than once (a context and an example concatenated, as TF Serving merges them), and
    # decode_proto keeps only the last occurrence of a singular field. BytesList's `value` is
    # field 1 too, repeated: decoded as a BytesList, an Example gives every occurrence, and
    # their concatenation is the one merged Features message.
    _, (parts,) = _decoded(serialized, "tensorflow.BytesList", ["value"], [tf.string])
    features = tf.strings.reduce_join(parts, axis=1)
    sizes, (entries,) = _decoded(features, "tensorflow.Features", ["feature"], [tf.string])
    ragged = tf.RaggedTensor.from_tensor(entries, lengths=sizes[:, 0])
    _, (keys, values) = _decoded(
        ragged.flat_values,
        "tensorflow.Features.FeatureEntry",
        ["key", "value"],
        [tf.string, tf.string],
    )
    return ragged.value_rowids(), _first(keys), _first(values)


def _numbers_of(
    values: tf.Tensor, rows: tf.Tensor, *, dtype: tf.DType, name: str
) -> tuple[tf.Tensor, tf.Tensor]:
    """(row of each number, the numbers as `dtype`) of serialized Features that hold a
    float_list or an int64_list; a bytes_list is refused with `tf.io.parse_example`'s words."""
    _, (float_lists, int_lists, byte_lists) = _decoded(
        values,
        "tensorflow.Feature",
        ["float_list", "int64_list", "bytes_list"],
        [tf.string, tf.string, tf.string],
    )
    no_bytes = tf.debugging.Assert(
        tf.reduce_all(tf.equal(_first(byte_lists), "")),
        [
            f"Key: {name}. Data types do not match. Data type: string but expected type: "
            f"{_type_name(dtype)} (a number: a float_list or an int64_list)"
        ],
    )
    float_counts, (floats,) = _decoded(
        _first(float_lists), "tensorflow.FloatList", ["value"], [tf.float32]
    )
    int_counts, (ints,) = _decoded(_first(int_lists), "tensorflow.Int64List", ["value"], [tf.int64])
    with tf.control_dependencies([no_bytes]):
        floats = tf.RaggedTensor.from_tensor(floats, lengths=float_counts[:, 0])
    ints = tf.RaggedTensor.from_tensor(ints, lengths=int_counts[:, 0])
    # A Feature holds one kind: per entry at most one of the two lists has values.
    as_dtype = tf.concat(
        [
            tf.RaggedTensor.from_row_splits(
                _as_feature_dtype(floats.flat_values, dtype, name), floats.row_splits
            ),
            tf.RaggedTensor.from_row_splits(tf.cast(ints.flat_values, dtype), ints.row_splits),
        ],
        axis=1,
    )
    return tf.gather(rows, as_dtype.value_rowids()), as_dtype.flat_values


def _first(field: tf.Tensor) -> tf.Tensor:
    """The single value of an optional message field decoded by `decode_proto` (b"" if unset)."""
    width = tf.shape(field)[1]
    return tf.reshape(tf.pad(field, [[0, 0], [0, 1 - width]]), [-1])


def export_serving_model(
    model: keras.Model,
    *,
    tft_output: tft.TFTransformOutput,
    label: str,
    export_dir: str,
    features: Sequence[str] | None = None,
    numeric: Sequence[str] = (),
    task: str = "classification",
) -> None:
    """Writes the SavedModel with all signatures to `export_dir` (which must not exist yet).

    `numeric` names the data spec's numeric columns: numbers in every signature (see the
    module docstring). `task`: the data spec's task (a regression model answers numbers)."""
    module = ServingModule(model, tft_output, label, features, numeric, task)
    tf.saved_model.save(module, export_dir, signatures=module.signatures())
    renamed = {
        internal_name(column): column
        for column in module.raw_input_columns
        if internal_name(column) != column
    }
    methods = (
        {REGRESSION: REGRESS_METHOD} if module.regression else {CLASSIFICATION: CLASSIFY_METHOD}
    )
    finish_signatures(export_dir, methods=methods, input_names={PREDICT_RAW: renamed})


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
