"""The Transformer: a BERT-style encoder per text column, pooled, beside the tabular features,
then the classifier.

Config section ``training.models.transformer``: ``layers``, ``d_model``, ``heads``, ``ffn_dim``,
``pooling`` ("mean" over non-padding tokens, or "cls": position 0), ``hidden_units`` (the
classifier's widths), and two training-graph levers that keep the maths and the weights:
``fused_kernels`` (layer norms, bias+GELU, the dropouts and dropout + residual run as small XLA
kernels between oneDNN matmuls, self-attention as one QKV matmul; :mod:`fused`) and
``trim_padding`` (each batch's text is cut after its longest text, rounded up to 16 tokens,
before the encoder: padding costs the same matmuls as tokens; off under ``jit_compile``). The
serving twin is always the plain full-length model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import keras
import tensorflow as tf
from keras import layers, ops

from trainer_module.training import fused as fused_kernels
from trainer_module.training.models.base import (
    Advice,
    ModelSpec,
    classifier,
    classifier_flops,
    keras_inputs,
    require,
    require_positive_int,
    tabular_features,
    tabular_width,
    units,
)

if TYPE_CHECKING:
    from trainer_module.training.config import ModelInputs, TrainingConfig

NAME = "transformer"
POOLINGS = ("mean", "cls")


@dataclass(frozen=True)
class TransformerOptions:
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    ffn_dim: int = 128
    pooling: str = "mean"
    hidden_units: tuple[int, ...] = (64, 64)
    fused_kernels: bool = True
    trim_padding: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden_units", units(NAME, "hidden_units", self.hidden_units))
        for option in ("layers", "d_model", "heads", "ffn_dim"):
            require_positive_int(NAME, option, getattr(self, option))
        require(
            self.pooling in POOLINGS, NAME, "pooling", f"must be one of {POOLINGS}", self.pooling
        )
        require(
            self.d_model % self.heads == 0,
            NAME,
            "d_model",
            f"must be divisible by `heads` ({self.heads})",
            self.d_model,
        )
        for option in ("fused_kernels", "trim_padding"):
            value = getattr(self, option)
            require(isinstance(value, bool), NAME, option, "must be true or false", value)


@keras.saving.register_keras_serializable(package="fullthrottle")
class PositionEmbedding(layers.Layer):
    """Adds a learned embedding of the position (0..seq_len-1) to a [batch, seq, d] input."""

    def __init__(self, seq_len: int, d_model: int, **kwargs):
        super().__init__(**kwargs)
        self.seq_len = seq_len
        self.d_model = d_model

    def build(self, input_shape):
        self.positions = self.add_weight(
            name="positions",
            shape=(self.seq_len, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
        )

    def call(self, x):
        # x may be shorter than seq_len (TrimPadding): the first positions' embeddings.
        positions = self.positions[: tf.shape(x)[1]]
        return x + ops.cast(positions, x.dtype)[None, :, :]

    def get_config(self):
        return {**super().get_config(), "seq_len": self.seq_len, "d_model": self.d_model}


@keras.saving.register_keras_serializable(package="fullthrottle")
class TrimPadding(layers.Layer):
    """Token ids [B, S] -> [B, L]: the batch cut after its last non-padding token, L rounded up
    to a multiple of ``multiple`` (at most S, at least ``multiple``).

    Why: texts are usually shorter than ``max_tokens``, and every position costs the same
    matmuls whether it holds a token or padding (the bundled text data: median 31 characters,
    longest 67, sequence 128: over half of every batch was padding). What is cut is padding in
    every row, which the model never lets matter: attention masks padding keys, pooling skips
    padding, and each position's layer norm and FFN see only that position. So the outputs and
    gradients are those of the full-length batch (tests compare them; one exception: with
    ``pooling: cls``, a text with no tokens at all pools its position 0, a padding
    position that attends only padding, whose value depends on how much padding there is).
    Rounding to a multiple keeps the number of distinct shapes small (at most S / multiple),
    since TensorFlow and the fused XLA kernels specialise per shape. Training graphs only (not with ``jit_compile``: XLA
    needs shapes known before the data); the serving model keeps the full length.
    """

    def __init__(self, multiple: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.multiple = int(multiple)

    def call(self, ids):
        seq = tf.shape(ids)[1]
        position = tf.range(1, seq + 1, dtype=tf.int32)[None, :]
        used = tf.reduce_max(tf.where(tf.not_equal(ids, 0), position, 0))
        m = self.multiple
        length = tf.minimum(tf.maximum((used + m - 1) // m * m, m), seq)
        return ids[:, :length]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], None)

    def get_config(self):
        return {**super().get_config(), "multiple": self.multiple}


@keras.saving.register_keras_serializable(package="fullthrottle")
class ByteDropout(layers.Layer):
    """Dropout drawing one random BYTE per element instead of one random float.

    Why: under ``mixed_bfloat16`` on CPU, Keras' Dropout (``stateless_dropout``: a bf16 uniform
    per element, compare, multiply) was the largest non-matmul cost of a Transformer step
    (profiled: ~15% of op time, attention-probability dropout on [B, H, S, S] the biggest).
    Here one Philox 32-bit word feeds four elements. The rate is quantized to 1/256
    (0.1 -> 26/256 = 0.1016); kept values are scaled by the exact inverse of the quantized
    keep probability, so the expected activation is unchanged. The random state lives in a
    Keras ``SeedGenerator`` (a ``seed_generator_state`` variable the controller checkpoints),
    like Keras' own Dropout. Identity at inference.
    """

    def __init__(self, rate: float, seed: int | None = None, fused: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True  # element-wise, like Keras' Dropout: masks pass through
        self.rate = float(rate)
        self.seed = seed
        self.fused = fused  # training models: one XLA kernel (fused.dropout), same mask
        # min(255): a rate that rounds to 256/256 would overflow the uint8 threshold.
        self.threshold = min(255, round(self.rate * 256))
        self.scale = 256.0 / (256 - self.threshold)
        self.seed_generator = keras.random.SeedGenerator(seed) if self.threshold else None

    def noise(self, shape) -> tf.Tensor:
        """The next mask's random bytes (uint8, ``shape``); an element is kept where its byte
        is >= ``self.threshold``. Advances the layer's seed generator."""
        return fused_kernels.random_bytes(shape, tf.cast(self.seed_generator.next(), tf.int64))

    def call(self, inputs, training=None):
        if not training or not self.threshold:
            return inputs
        x = tf.convert_to_tensor(inputs)
        noise = self.noise(tf.shape(x))
        if self.fused:
            return fused_kernels.dropout(x, noise, self.threshold, self.scale)
        keep = noise >= tf.constant(self.threshold, tf.uint8)
        return tf.where(keep, x * tf.cast(self.scale, x.dtype), tf.zeros_like(x))

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed, "fused": self.fused}


@keras.saving.register_keras_serializable(package="fullthrottle")
def gelu_float32(x):
    """Exact GELU computed in float32 and returned in the input's dtype.

    Why: TensorFlow's CPU ``Erfc`` kernel in bfloat16 was ~3x slower than in float32
    (profiled, d_model 256 Transformer step); two casts cost far less. A no-op cast in float32.
    """
    return ops.cast(keras.activations.gelu(ops.cast(x, "float32")), x.dtype)


@keras.saving.register_keras_serializable(package="fullthrottle")
class ByteDropoutAttention(layers.MultiHeadAttention):
    """Keras MultiHeadAttention whose attention-probability dropout ([B, heads, S, S], the
    block's largest dropout) is a :class:`ByteDropout`. Keras 3.15 keeps that dropout in the
    private ``_dropout_layer`` made in ``build``; it is replaced there, before Keras locks the
    layer's state. Same weights and maths otherwise. (Training models with ``fused=True``
    do not call it: :meth:`TransformerBlock._fused_self_attention` uses its weights.)
    """

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        if self._dropout > 0.0:
            self._dropout_layer = ByteDropout(self._dropout, dtype=self.dtype_policy)


@keras.saving.register_keras_serializable(package="fullthrottle")
class LayerNorm(layers.LayerNormalization):
    """Keras LayerNormalization over the last axis; ``fused=True`` (training models) runs it
    as XLA kernels (:func:`fused.layer_norm`). Same weights (gamma, beta) and maths."""

    def __init__(self, *args, fused: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.fused = fused

    def call(self, inputs):
        last = len(inputs.shape) - 1
        if (
            self.fused
            and self.center
            and self.scale
            and not self.rms_scaling
            and list(self.axis) in ([last], [-1])
        ):
            return fused_kernels.layer_norm(inputs, self.gamma, self.beta, self.epsilon)
        return super().call(inputs)

    def get_config(self):
        return {**super().get_config(), "fused": self.fused}


@keras.saving.register_keras_serializable(package="fullthrottle")
class TransformerBlock(layers.Layer):
    """Pre-LayerNorm encoder block: x + MHA(LN(x)), then x + FFN(LN(x)).

    Pre-LN trains stably without a learning-rate warm-up tuned per depth (Xiong et al. 2020).

    ``fused=True`` (the training model, option ``fused_kernels``): layer norms,
    bias+GELU, attention dropout and each dropout + residual add run as XLA kernels
    (:mod:`fused`), and self-attention as one QKV matmul (:meth:`_fused_self_attention`);
    same weights and maths, so the plain (serving) twin loads them as is.
    """

    def __init__(self, d_model, heads, ffn_dim, dropout_rate, fused: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.heads, self.ffn_dim = d_model, heads, ffn_dim
        self.dropout_rate = dropout_rate
        self.fused = fused
        p = self.dtype_policy
        self.ln1 = LayerNorm(epsilon=1e-6, fused=fused, dtype=p)
        self.mha = ByteDropoutAttention(heads, d_model // heads, dropout=dropout_rate, dtype=p)
        self.ln2 = LayerNorm(epsilon=1e-6, fused=fused, dtype=p)
        # No activation here: call() applies GELU (plain or fused).
        self.ffn1 = layers.Dense(ffn_dim, dtype=p)
        self.ffn2 = layers.Dense(d_model, dtype=p)
        self.drop = ByteDropout(dropout_rate, dtype=p)

    def build(self, input_shape):
        self.ln1.build(input_shape)
        self.mha.build(input_shape, input_shape)

        self.ln2.build(input_shape)
        self.ffn1.build(input_shape)
        self.ffn2.build((*input_shape[:-1], self.ffn_dim))

    def _residual(self, x, h, training, bias=None):
        """x + dropout(h + bias); ``bias`` only on the fused path, where a projection's bias
        is added inside the dropout kernel rather than by a BiasAdd after its matmul (see
        :func:`fused.dropout_add`)."""
        if not self.fused:
            return x + self.drop(h, training=training)
        if not training or not self.drop.threshold:
            return x + (h if bias is None else fused_kernels.bias_add(h, bias))
        noise = self.drop.noise(tf.shape(h))
        return fused_kernels.dropout_add(
            x, h, noise, self.drop.threshold, self.drop.scale, bias=bias
        )

    def _fused_self_attention(self, h, attention_mask, training):
        """``self.mha(h, h, attention_mask)`` with the same weights, as 2 matmuls instead of 4
        einsums: Q, K and V projected by ONE [d, 3d] matmul (the 1/sqrt(head dim) query scale
        folded into its query columns), one BiasAdd (its gradient is one column sum instead
        of three Sums and the input gradient one matmul instead of three plus an AddN), heads
        split by one transpose; the output projection one [d, d] matmul. Returns that
        projection WITHOUT its bias, and the bias, which the caller adds inside its dropout +
        residual kernel (:meth:`_residual`)."""
        mha, d, heads = self.mha, self.d_model, self.heads
        size = d // heads
        scale = 1.0 / math.sqrt(size)
        q_dense, k_dense, v_dense = mha._query_dense, mha._key_dense, mha._value_dense
        kernel = tf.concat(
            [
                tf.reshape(q_dense.kernel, [d, d]) * tf.cast(scale, h.dtype),
                tf.reshape(k_dense.kernel, [d, d]),
                tf.reshape(v_dense.kernel, [d, d]),
            ],
            axis=1,
        )
        bias = tf.concat(
            [
                tf.reshape(q_dense.bias, [d]) * tf.cast(scale, h.dtype),
                tf.reshape(k_dense.bias, [d]),
                tf.reshape(v_dense.bias, [d]),
            ],
            axis=0,
        )
        batch, seq = tf.shape(h)[0], tf.shape(h)[1]
        qkv = fused_kernels.bias_add(tf.matmul(tf.reshape(h, [-1, d]), kernel), bias)
        qkv = tf.transpose(tf.reshape(qkv, [batch, seq, 3, heads, size]), [2, 0, 3, 1, 4])
        # unstack, not qkv[i]: a slice's gradient is a full-size zero tensor per slice + AddN.
        q, k, v = tf.unstack(qkv, num=3, axis=0)  # [B, heads, S, size]
        scores = tf.matmul(q, k, transpose_b=True)  # [B, heads, S, S]
        mask = tf.ones([1, 1, 1, 1], tf.bool) if attention_mask is None else attention_mask
        mask = tf.cast(mask, tf.bool)
        if len(mask.shape) == 3:
            mask = mask[:, None, :, :]
        dropout = mha._dropout_layer if mha._dropout > 0.0 else None
        if training and dropout is not None and dropout.threshold:
            probs = fused_kernels.masked_softmax_dropout(
                scores, mask, dropout.noise(tf.shape(scores)), dropout.threshold, dropout.scale
            )
        else:
            probs = fused_kernels.masked_softmax_dropout(scores, mask, None, 0, 1.0)
        out = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])  # [B, S, heads, size]
        o_dense = mha._output_dense
        out = tf.matmul(tf.reshape(out, [-1, d]), tf.reshape(o_dense.kernel, [d, d]))
        # Its bias is added by the caller's dropout + residual kernel (``_residual``).
        return tf.reshape(out, tf.shape(h)), o_dense.bias

    def call(self, x, attention_mask=None, training=None):
        h = self.ln1(x)
        if self.fused:
            h, bias = self._fused_self_attention(h, attention_mask, training)
            x = self._residual(x, h, training, bias=bias)
        else:
            h = self.mha(h, h, attention_mask=attention_mask, training=training)
            x = self._residual(x, h, training)
        h = self.ln2(x)
        if self.fused:
            # ffn1's matmul alone, then its bias-add and GELU as one kernel.
            z = tf.matmul(tf.reshape(h, [-1, self.d_model]), self.ffn1.kernel)
            h = fused_kernels.bias_gelu(z, self.ffn1.bias)
            h = tf.reshape(tf.matmul(h, self.ffn2.kernel), tf.shape(x))
            return self._residual(x, h, training, bias=self.ffn2.bias)
        h = self.ffn2(gelu_float32(self.ffn1(h)))
        return self._residual(x, h, training)

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "heads": self.heads,
            "ffn_dim": self.ffn_dim,
            "dropout_rate": self.dropout_rate,
            "fused": self.fused,
        }


@keras.saving.register_keras_serializable(package="fullthrottle")
class PaddingMask(layers.Layer):
    """token ids [B, S] -> attention mask [B, S, S] (True where the key is not padding)."""

    def call(self, ids):
        keep = ops.not_equal(ids, 0)
        return ops.logical_and(keep[:, None, :], ops.ones_like(keep)[:, :, None])


@keras.saving.register_keras_serializable(package="fullthrottle")
class MaskedPooling(layers.Layer):
    """[B, S, d] -> [B, d]: mean over non-padding tokens, or the first (CLS) position."""

    def __init__(self, mode: str = "mean", **kwargs):
        super().__init__(**kwargs)
        self.mode = mode

    def call(self, x, ids):
        if self.mode == "cls":
            return x[:, 0, :]
        w = ops.cast(ops.not_equal(ids, 0), x.dtype)[:, :, None]
        # max(count, 1): an all-padding row pools to zeros instead of NaN.
        return ops.sum(x * w, axis=1) / ops.maximum(ops.sum(w, axis=1), 1.0)

    def get_config(self):
        return {**super().get_config(), "mode": self.mode}


def check_inputs(model_inputs: ModelInputs) -> str | None:
    return None if model_inputs.text else "`ModelInputs.text` names no column"


def trims_padding(options: TransformerOptions, config: TrainingConfig) -> bool:
    """Whether the training graph trims padding: shapes known only from the data cannot be
    XLA-compiled as part of the step."""
    return options.trim_padding and not config.jit_compile


def build(
    model_inputs: ModelInputs,
    options: TransformerOptions,
    config: TrainingConfig,
    policy: keras.DTypePolicy,
    *,
    training: bool,
) -> keras.Model:
    """The fused kernels and padding trimming only in training graphs; the same variables
    either way, so weights move freely between the two (the serving twin is built plain)."""
    fused = training and options.fused_kernels
    trim = training and trims_padding(options, config)
    inputs = keras_inputs(model_inputs)
    parts = tabular_features(inputs, model_inputs, config, policy)
    d = options.d_model
    for name, (vocab, seq_len) in model_inputs.text.items():
        ids = inputs[name]
        if trim:
            ids = TrimPadding(dtype=policy, name=f"trim_{name}")(ids)
        x = layers.Embedding(vocab, d, dtype=policy, name=f"tok_{name}")(ids)
        x = PositionEmbedding(seq_len, d, dtype=policy, name=f"pos_{name}")(x)
        x = ByteDropout(config.dropout_rate, fused=fused, dtype=policy)(x)
        mask = PaddingMask(dtype=policy, name=f"mask_{name}")(ids)
        for i in range(options.layers):
            x = TransformerBlock(
                d,
                options.heads,
                options.ffn_dim,
                config.dropout_rate,
                fused=fused,
                dtype=policy,
                name=f"block{i}_{name}",
            )(x, attention_mask=mask)
        x = LayerNorm(epsilon=1e-6, fused=fused, dtype=policy, name=f"ln_{name}")(x)
        parts.append(MaskedPooling(options.pooling, dtype=policy, name=f"pool_{name}")(x, ids))
    probabilities = classifier(
        parts,
        hidden_units=options.hidden_units,
        model_inputs=model_inputs,
        config=config,
        policy=policy,
    )
    return keras.Model(inputs=inputs, outputs=probabilities, name=f"fullthrottle_{NAME}")


def forward_flops(
    model_inputs: ModelInputs, options: TransformerOptions, config: TrainingConfig
) -> float:
    """Per text column of sequence S, width d, FFN f, per layer: Q, K, V and output projections
    4 x 2·S·d²; scores Q·Kᵀ 2·S²·d; weights·V 2·S²·d; FFN 2·S·d·f + 2·S·f·d, so
    8·S·d² + 4·S²·d + 4·S·d·f; then the classifier on the tabular features and d per text
    column. For the full sequence (what the untrimmed graph computes)."""
    d, f = options.d_model, options.ffn_dim
    forward = 0.0
    width = tabular_width(model_inputs, config)
    for _, seq_len in model_inputs.text.values():
        s = seq_len
        forward += options.layers * (8 * s * d * d + 4 * s * s * d + 4 * s * d * f)
        width += d
    return forward + classifier_flops(width, options.hidden_units, model_inputs.output_units)


def advice(options: TransformerOptions, config: TrainingConfig) -> list[Advice]:
    """The training-graph levers, for a run that has them off (whole-graph XLA fuses everything
    itself, and needs shapes before the data, so neither is offered under ``jit_compile``). No
    figures: the advisor offers a lever only where the benchmark measured it faster, and
    quotes that measurement."""
    if config.jit_compile:
        return []
    found = []
    if not options.fused_kernels:
        found.append(
            Advice(
                "fused_kernels",
                True,
                "runs the Transformer's layer norms, GELU, softmax dropout and residual dropouts "
                "as fused XLA kernels between the matmuls (same maths and weights)",
            )
        )
    if not options.trim_padding:
        found.append(
            Advice(
                "trim_padding",
                True,
                "cuts each batch's text after its longest text, so padding costs no matmuls "
                "(same outputs and gradients; no gain where texts fill the sequence)",
            )
        )
    return found


MODEL = ModelSpec(
    name=NAME,
    options=TransformerOptions,
    build=build,
    forward_flops=forward_flops,
    advice=advice,
    check_inputs=check_inputs,
)
