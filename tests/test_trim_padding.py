"""Trimming padding (``training.models.transformer.trim_padding``): each batch's text is cut
after its longest text, and the model's outputs and gradients are those of the full-length
batch."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.training_data import SMALL_TRANSFORMER
from trainer_module.training import ModelInputs, build_model
from trainer_module.training.models.transformer import TrimPadding

SEQ = 64
INPUTS = ModelInputs(numeric=("x0",), text={"tokens": (50, SEQ)}, label="label", num_classes=3)
CONFIG = SMALL_TRANSFORMER


def _ids(lengths, seq=SEQ, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), seq), np.int64)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(1, 50, size=n)
    return tf.constant(ids)


def test_trim_cuts_after_the_longest_text_rounded_up_to_the_multiple():
    trim = TrimPadding(multiple=16)
    assert trim(_ids([5, 17, 0])).shape == (3, 32)  # longest 17 -> 32
    assert trim(_ids([16, 3])).shape == (2, 16)
    assert trim(_ids([0, 0])).shape == (2, 16)  # every text empty: one block, not zero
    assert trim(_ids([64, 1])).shape == (2, 64)  # a full-length text: nothing to cut
    assert trim(_ids([60])).shape == (1, 64)  # rounded up, but never past the sequence
    # A zero inside a text is not its end: the cut is after the last non-zero id.
    ids = np.zeros((1, SEQ), np.int64)
    ids[0, [0, 20]] = 7
    trimmed = trim(tf.constant(ids))
    assert trimmed.shape == (1, 32) and int(trimmed[0, 20]) == 7
    # What is kept is the batch's own prefix.
    full = _ids([5, 17, 0])
    np.testing.assert_array_equal(trim(full).numpy(), full.numpy()[:, :32])


@pytest.mark.parametrize("fused", [False, True])
def test_trimmed_model_gives_the_full_length_outputs_and_gradients(fused):
    keras.utils.set_random_seed(3)

    def graph(trim):
        options = dict(fused_kernels=fused, trim_padding=trim)
        config = CONFIG.with_model_options("transformer", **options)
        return build_model(INPUTS, config, "float32", training=True)

    full, trimmed = graph(trim=False), graph(trim=True)
    trimmed.set_weights(full.get_weights())
    assert [type(layer).__name__ for layer in trimmed.layers].count("TrimPadding") == 1
    features = {
        "x0": tf.constant([0.5, -1.0, 2.0, 0.0], tf.float32),
        # longest 20: the encoder sees 32 of 64; an empty text pools to zeros either way.
        "tokens": _ids([3, 20, 11, 0], seed=4),
    }
    labels = tf.constant([0, 1, 2, 1])
    results = []
    for model in (full, trimmed):
        with tf.GradientTape() as tape:
            probs = model(features, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, probs))
        results.append((probs, tape.gradient(loss, model.trainable_variables)))
    (p_full, g_full), (p_trim, g_trim) = results
    np.testing.assert_allclose(p_trim.numpy(), p_full.numpy(), rtol=1e-5, atol=1e-6)
    for a, b, v in zip(g_trim, g_full, full.trainable_variables, strict=True):
        np.testing.assert_allclose(
            tf.convert_to_tensor(a).numpy(),
            tf.convert_to_tensor(b).numpy(),
            rtol=1e-4,
            atol=1e-6,
            err_msg=v.path,
        )
    # The position embeddings past the cut get exactly zero gradient, as in the full model.
    positions = [i for i, v in enumerate(full.trainable_variables) if "pos_" in v.path]
    assert len(positions) == 1
    np.testing.assert_array_equal(tf.convert_to_tensor(g_trim[positions[0]]).numpy()[32:], 0.0)


def test_only_the_training_graph_trims_and_not_under_jit_compile_or_when_configured_off():
    def trims(config, training=True):
        model = build_model(INPUTS, config, "float32", training=training)
        return any(isinstance(layer, TrimPadding) for layer in model.layers)

    assert trims(CONFIG)  # the default
    assert not trims(CONFIG, training=False)  # the serving twin keeps the full length
    assert not trims(dataclasses.replace(CONFIG, jit_compile=True))
    assert not trims(CONFIG.with_model_options("transformer", trim_padding=False))
