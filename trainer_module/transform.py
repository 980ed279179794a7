"""The Transform component's `preprocessing_fn`, generic over the data spec.

The pipeline passes the validated `DataSpec` in Transform's `custom_config`; nothing here knows
about penguins. What each column kind becomes:

- numeric: missing and non-finite values imputed with the training mean, then z-scored
  (mean and variance computed over present, finite values only) -> float32 scalar.
- categorical: vocabulary over the training split, one out-of-vocabulary bucket, missing values
  as their own token -> int64 id in [0, vocab + 1).
- text: lower-cased, split into words (whitespace) or Unicode characters (so CJK text works),
  truncated to `max_tokens`, vocabulary of the `vocab_size` most frequent tokens plus one OOV
  bucket, ids shifted by one so that 0 is padding -> int64 [max_tokens].
- label: classification (`data.task`): vocabulary (no OOV bucket) -> int64 class id; the
  vocabulary file names the classes. Regression: the number as it is -> float32 (no vocabulary;
  staging refuses rows without one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf
import tensorflow_transform as tft

from fullthrottle.core.config import data_spec_from_custom_config
from fullthrottle.core.features import (
    LABEL_VOCAB,
    NUM_OOV_BUCKETS,
    transformed_name,
    vocab_name,
)

MISSING_TOKEN = "__missing__"


def _as_sparse(x: Any) -> tf.SparseTensor | None:
    if isinstance(x, tf.SparseTensor):
        return x
    if isinstance(x, tf.RaggedTensor):
        return x.to_sparse()
    return None


def _dense_scalar(x: Any, default: Any) -> tf.Tensor:
    """One value per example: fills missing cells with `default`; keeps the first value."""
    sparse = _as_sparse(x)
    if sparse is not None:
        batch = sparse.dense_shape[0]
        # A batch where every value is missing has dense_shape [B, 0]: widen to [B, 1].
        sparse = tf.SparseTensor(
            sparse.indices, sparse.values, tf.stack([batch, tf.constant(1, tf.int64)])
        )
        dense = tf.sparse.to_dense(sparse, default_value=default)
        return tf.reshape(dense[:, :1], [-1])
    x = tf.convert_to_tensor(x)
    if x.shape.rank is not None and x.shape.rank > 1:
        return tf.reshape(x[:, :1], [-1])
    return tf.reshape(x, [-1])


def _present_values(x: Any) -> tf.Tensor:
    sparse = _as_sparse(x)
    values = sparse.values if sparse is not None else tf.reshape(x, [-1])
    return values


def _to_float(x: Any) -> Any:
    if isinstance(x, tf.SparseTensor):
        return tf.SparseTensor(x.indices, tf.cast(x.values, tf.float32), x.dense_shape)
    if isinstance(x, tf.RaggedTensor):
        return tf.cast(x, tf.float32)
    return tf.cast(x, tf.float32)


def _numeric(x: Any) -> tf.Tensor:
    x = _to_float(x)  # integer columns too: missing cells become NaN, then the mean
    values = _present_values(x)
    finite = tf.boolean_mask(values, tf.math.is_finite(values))
    mean = tft.mean(finite)
    var = tft.var(finite)
    dense = _dense_scalar(x, default=float("nan"))
    dense = tf.where(tf.math.is_finite(dense), dense, mean)
    # A constant column has variance 0: leave it centred rather than dividing by zero.
    std = tf.sqrt(var)
    return tf.where(std > 0, (dense - mean) / tf.maximum(std, 1e-12), dense - mean)


def _dtype_of(x: Any) -> tf.DType:
    return (
        x.values.dtype
        if isinstance(x, (tf.SparseTensor, tf.RaggedTensor))
        else tf.convert_to_tensor(x).dtype
    )


def _as_strings(x: Any) -> Any:
    dtype = _dtype_of(x)
    if dtype == tf.string:
        return x
    if isinstance(x, tf.SparseTensor):
        return tf.SparseTensor(x.indices, tf.strings.as_string(x.values), x.dense_shape)
    if isinstance(x, tf.RaggedTensor):
        return tf.ragged.map_flat_values(tf.strings.as_string, x)
    return tf.strings.as_string(x)


def _categorical(x: Any, column: str) -> tf.Tensor:
    dense = _dense_scalar(_as_strings(x), default=MISSING_TOKEN)
    return tft.compute_and_apply_vocabulary(
        dense, num_oov_buckets=NUM_OOV_BUCKETS, vocab_filename=vocab_name(column)
    )


def _text(x: Any, column: Any) -> tf.Tensor:
    text = _dense_scalar(_as_strings(x), default="")
    if column.lowercase:
        text = tf.strings.lower(text, encoding="utf-8")
    if column.tokenizer == "char":
        tokens = tf.strings.unicode_split(text, "UTF-8")
        tokens = tf.ragged.boolean_mask(tokens, tf.strings.strip(tokens) != "")
    else:
        tokens = tf.strings.split(text)
    tokens = tokens[:, : column.max_tokens]
    sparse_tokens = tokens.to_sparse()
    ids = tft.compute_and_apply_vocabulary(
        sparse_tokens,
        top_k=column.vocab_size,
        num_oov_buckets=NUM_OOV_BUCKETS,
        vocab_filename=vocab_name(column.name),
    )
    batch = tf.shape(text, out_type=tf.int64)[0]
    shifted = tf.SparseTensor(
        ids.indices, ids.values + 1, tf.stack([batch, tf.constant(column.max_tokens, tf.int64)])
    )
    dense = tf.sparse.to_dense(shifted, default_value=0)
    # A static [None, max_tokens] shape makes Transform write a FixedLenFeature([max_tokens]).
    return tf.reshape(dense, [-1, column.max_tokens])


def preprocessing_fn(
    inputs: Mapping[str, Any], custom_config: Mapping[str, Any]
) -> dict[str, tf.Tensor]:
    """Called by TFX Transform; `custom_config["data"]` is the pipeline's `DataSpec` as a dict."""
    spec = data_spec_from_custom_config(custom_config)
    outputs: dict[str, tf.Tensor] = {}
    for column in spec.numeric:
        outputs[transformed_name(column)] = _numeric(inputs[column])
    for column in spec.categorical:
        outputs[transformed_name(column)] = _categorical(inputs[column], column)
    for column in spec.text:
        outputs[transformed_name(column.name)] = _text(inputs[column.name], column)
    if spec.task == "regression":
        outputs[transformed_name(spec.label)] = _dense_scalar(
            _to_float(inputs[spec.label]), default=float("nan")
        )
        return outputs
    label = _dense_scalar(_as_strings(inputs[spec.label]), default="")
    outputs[transformed_name(spec.label)] = tft.compute_and_apply_vocabulary(
        label, num_oov_buckets=0, vocab_filename=LABEL_VOCAB
    )
    return outputs
