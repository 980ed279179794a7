"""Transformed-looking training data for the benchmark code's tests, without a pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fullthrottle.bench.workloads import TrainingData
from trainer_module.training import ModelInputs


def write_synthetic_training_data(
    directory: Path,
    *,
    rows: int,
    numeric: int = 4,
    seq_len: int = 0,
    vocab: int = 50,
    seed: int = 0,
) -> TrainingData:
    """Gzip TFRecords of ``numeric`` float features, optionally one token-id sequence of
    ``seq_len``, and a 3-class label that depends on the features, as ``TrainingData``."""
    import numpy as np
    import tensorflow as tf
    from tensorflow_transform.tf_metadata import schema_utils

    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    split = directory / "Split-train"
    split.mkdir(exist_ok=True)
    path = split / "data.gz"
    names = [f"x{i}_xf" for i in range(numeric)]
    with tf.io.TFRecordWriter(str(path), options="GZIP") as writer:
        for _ in range(rows):
            label = int(rng.integers(3))
            feature = {
                n: tf.train.Feature(
                    float_list=tf.train.FloatList(value=[float(rng.normal() + label)])
                )
                for n in names
            }
            feature["label_xf"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
            if seq_len:
                ids = rng.integers(1, vocab, size=seq_len).tolist()
                feature["text_xf"] = tf.train.Feature(int64_list=tf.train.Int64List(value=ids))
            writer.write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )
    spec: dict[str, Any] = {n: tf.io.FixedLenFeature([], tf.float32) for n in names}
    spec["label_xf"] = tf.io.FixedLenFeature([], tf.int64)
    text = {}
    if seq_len:
        spec["text_xf"] = tf.io.FixedLenFeature([seq_len], tf.int64)
        text = {"text_xf": (vocab, seq_len)}
    return TrainingData(
        name="synthetic",
        train_files=(str(path),),
        examples_uri=str(directory),
        feature_spec=spec,
        schema=schema_utils.schema_from_feature_spec(spec),
        model_inputs=ModelInputs(numeric=tuple(names), text=text, label="label_xf", num_classes=3),
    )
