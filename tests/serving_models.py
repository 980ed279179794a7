"""Small real SavedModels with the signature kinds the penguins model lacks.

`write_contract_model(folder, scale=...)` writes a SavedModel (TensorFlow 2.21, no Keras) with:

- ``serving_default`` (predict): ``x`` float32 ``[None]`` and ``flag`` bool ``[None]`` ->
  ``y`` = x * scale (where flag, else 0), ``id_bytes`` (the bytes 0xff 0x00 + flag's text, a
  ``_bytes`` output that is not UTF-8) and ``label`` (a string);
- ``half`` (predict, one input, one output): ``x`` float32 ``[None]`` -> ``y`` = x / 2;
- ``regress_x`` (regress): serialized tf.Example ``inputs`` with float feature ``x`` ->
  ``outputs`` = x * scale;
- ``classify_x`` (classify): the same input -> ``classes`` ["neg", "pos"] and ``scores``
  (sigmoid(x * scale) for "pos");
- ``dtypes`` (predict): ``x`` float32 ``[None]`` -> x as each dtype TF Serving writes to its own
  TensorProto field (``f32``, ``f64``, ``f16``, ``bf16``, ``i8``, ``i32``, ``i64``, ``u8``,
  ``u32``, ``u64``, ``flag`` bool, ``text`` string) and ``pair`` float32 ``[None, 2]``.

Two versions written with different `scale` answer differently, which the version and label
tests rely on.
"""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from serving.signatures import CLASSIFY_METHOD, REGRESS_METHOD, set_signature_methods


def write_contract_model(folder: Path, *, scale: float) -> Path:
    module = tf.Module()
    module.scale = tf.Variable(scale, dtype=tf.float32)
    spec = {"x": tf.io.FixedLenFeature([], tf.float32, default_value=0.0)}

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.float32, name="x"),
            tf.TensorSpec([None], tf.bool, name="flag"),
        ]
    )
    def serving_default(x, flag):
        y = tf.where(flag, x * module.scale, tf.zeros_like(x))
        id_bytes = tf.strings.join(
            [tf.fill(tf.shape(x), tf.constant(b"\xff\x00")), tf.strings.as_string(flag)]
        )
        label = tf.where(flag, tf.fill(tf.shape(x), "on"), tf.fill(tf.shape(x), "off"))
        return {"y": y, "id_bytes": id_bytes, "label": label}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def half(x):
        return {"y": x / 2.0}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def regress_x(inputs):
        x = tf.io.parse_example(inputs, spec)["x"]
        return {"outputs": x * module.scale}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def classify_x(inputs):
        x = tf.io.parse_example(inputs, spec)["x"]
        positive = tf.sigmoid(x * module.scale)
        scores = tf.stack([1.0 - positive, positive], axis=1)
        classes = tf.tile(tf.constant([["neg", "pos"]]), [tf.shape(x)[0], 1])
        return {"classes": classes, "scores": scores}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def dtypes(x):
        casts = {"f32": tf.float32, "f64": tf.float64, "f16": tf.float16, "bf16": tf.bfloat16}
        casts |= {"i8": tf.int8, "i32": tf.int32, "i64": tf.int64, "u8": tf.uint8}
        casts |= {"u32": tf.uint32, "u64": tf.uint64}
        outputs = {name: tf.cast(x, dtype) for name, dtype in casts.items()}
        outputs["flag"] = x > 0
        outputs["text"] = tf.strings.as_string(x)
        outputs["pair"] = tf.stack([x, -x], axis=1)
        return outputs

    folder.mkdir(parents=True, exist_ok=True)
    tf.saved_model.save(
        module,
        str(folder),
        signatures={
            "serving_default": serving_default.get_concrete_function(),
            "half": half.get_concrete_function(),
            "regress_x": regress_x.get_concrete_function(),
            "classify_x": classify_x.get_concrete_function(),
            "dtypes": dtypes.get_concrete_function(),
        },
    )
    set_signature_methods(str(folder), {"regress_x": REGRESS_METHOD, "classify_x": CLASSIFY_METHOD})
    return folder
