"""Small, deterministic, learnable synthetic data for the training-library tests.

Writes GZIP TFRecords of tf.Examples shaped like Transform's output (numeric float32 [],
categorical int64 [], text int64 [seq_len] with 0 = padding, label int64 []).
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from trainer_module.training import ModelInputs, TrainingConfig

NUM_CLASSES = 3
CARDINALITY = 5
VOCAB = 30
SEQ_LEN = 8


def tabular_inputs() -> ModelInputs:
    return ModelInputs(
        numeric=("x0", "x1", "x2"),
        categorical={"cat": CARDINALITY},
        label="label",
        num_classes=NUM_CLASSES,
    )


def text_inputs() -> ModelInputs:
    return ModelInputs(
        numeric=("x0",),
        text={"tokens": (VOCAB, SEQ_LEN)},
        label="label",
        num_classes=NUM_CLASSES,
    )


# A small 2-layer Transformer for tests that compare models on the same weights.
SMALL_TRANSFORMER = TrainingConfig(
    model="transformer",
    models={
        "transformer": {
            "layers": 2,
            "d_model": 32,
            "heads": 4,
            "ffn_dim": 64,
            "hidden_units": (16,),
        }
    },
    dropout_rate=0.0,
)


def feature_spec(model_inputs: ModelInputs) -> dict[str, tf.io.FixedLenFeature]:
    spec = {n: tf.io.FixedLenFeature([], tf.float32) for n in model_inputs.numeric}
    spec.update({n: tf.io.FixedLenFeature([], tf.int64) for n in model_inputs.categorical})
    spec.update(
        {n: tf.io.FixedLenFeature([s], tf.int64) for n, (_, s) in model_inputs.text.items()}
    )
    spec[model_inputs.label] = tf.io.FixedLenFeature([], tf.int64)
    return spec


def _example(features: dict) -> bytes:
    feat = {}
    for k, v in features.items():
        v = np.atleast_1d(v)
        if v.dtype.kind == "f":
            feat[k] = tf.train.Feature(float_list=tf.train.FloatList(value=v.tolist()))
        else:
            feat[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=v.tolist()))
    return tf.train.Example(features=tf.train.Features(feature=feat)).SerializeToString()


def _rows(model_inputs: ModelInputs, n: int, rng: np.random.Generator):
    """Label = a deterministic function of the features (so the loss can fall)."""
    for _ in range(n):
        row = {}
        x = rng.normal(size=3).astype(np.float32)
        for i, name in enumerate(model_inputs.numeric):
            row[name] = np.float32(x[i])
        score = x[0] - 0.5 * (x[1] if len(model_inputs.numeric) > 1 else 0.0)
        if model_inputs.categorical:
            c = int(rng.integers(CARDINALITY))
            row["cat"] = np.int64(c)
            score += 0.8 * (c - 2)
        if model_inputs.text:
            length = int(rng.integers(2, SEQ_LEN + 1))
            cls = int(rng.integers(NUM_CLASSES))
            # Tokens 1..9 belong to class 0, 10..19 to class 1, 20..29 to class 2 (mostly).
            ids = np.where(
                rng.random(length) < 0.7,
                rng.integers(1, 10, size=length) + 10 * cls,
                rng.integers(1, VOCAB, size=length),
            )
            row["tokens"] = np.pad(ids, (0, SEQ_LEN - length)).astype(np.int64)
            row["label"] = np.int64(cls)
        else:
            row["label"] = np.int64(0 if score < -0.5 else (1 if score < 0.5 else 2))
        yield row


def write_records(
    directory, model_inputs: ModelInputs, *, files: int = 2, per_file: int = 256, seed: int = 0
) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(files):
        path = os.path.join(str(directory), f"part-{i:05d}.tfrecord.gz")
        with tf.io.TFRecordWriter(path, options="GZIP") as w:
            for row in _rows(model_inputs, per_file, rng):
                w.write(_example(row))
        paths.append(path)
    return paths
