"""Fused element-wise kernels for the Transformer's training graph: bias + GELU, layer norm,
dropout (after attention's softmax, on embeddings) and dropout + residual add.

Why: on CPU, mixed_bfloat16 halves the matmuls' time but not the element-wise work around
them, and TensorFlow runs each element-wise op as its own pass over memory (exact GELU forward
and backward is ~20 passes over a [batch, seq, ffn] tensor). Profiled on the benchmark's
Transformer (d_model 256, FFN 1024, seq 128, batch 64, mixed_bfloat16, 2 cores), matmuls were
about a third of op time and GELU alone a sixth. Each kernel here is a forward and a backward
function, both XLA-compiled (``jit_compile=True``), tied together with ``tf.custom_gradient``:
XLA fuses each into one or two passes, while the matmuls between them stay on TensorFlow's
oneDNN kernels (whole-model XLA was measured slower here: its CPU dots do not reach oneDNN's
bf16 speed; an XLA softmax was slower than oneDNN's too, so the softmax stays TensorFlow's). Maths is the same as the Keras layers they replace (tests compare values and
gradients); all arithmetic is float32 inside, inputs and outputs keep their dtype.

Dropout masks are drawn by TensorFlow's stateless Philox kernel (outside XLA) as one random
byte per element; the same bytes are kept for the backward pass (1 byte per element), so the
forward and backward masks agree by construction.

Only the training graph uses these (``build_model(..., training=True)`` with the Transformer's
``fused_kernels``); the serving twin and the TFX-example baseline use plain Keras layers, so
exported SavedModels contain no XLA clusters.
"""

from __future__ import annotations

import functools
import math

import tensorflow as tf

from trainer_module.training.hardware import cpu_has_native_bf16, tensorflow_gpus

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _f32(x):
    return tf.cast(x, tf.float32)


# ------------------------------------------------------------------------- bias gradients
def column_sum(x):
    """Sum of ``x`` [..., C] over every axis but the last, as one matmul ``ones[1, N] @ x``.

    This is how the fused kernels' bias, gamma and beta gradients are summed. oneDNN's matmul
    accumulates in float32 whatever the inputs' dtype, so a bfloat16 ``x`` gets a float32 sum
    rounded once. TensorFlow's CPU ``BiasAddGrad`` (what a Keras Dense bias gets) accumulates
    a bfloat16 gradient in bfloat16: summing a [8192, 1024] N(0, 1) tensor, its largest error
    was 49 against sums of size ~90 (the matmul's: 0.66, the final rounding). It is also
    faster: 0.95 vs 1.63 ms for that tensor, 0.27 vs 0.39 ms for a float32 [8192, 256]
    ``reduce_sum`` (2 cores).

    Where bfloat16 is emulated (see :func:`_bf16_matmul_sums_in_float32`), a bfloat16 ``x`` is
    cast to float32 for the matmul and the sum rounded to bfloat16 once, as oneDNN does."""
    rows = tf.reshape(x, [-1, tf.shape(x)[-1]])
    dtype = x.dtype
    if dtype == tf.bfloat16 and not _bf16_matmul_sums_in_float32():
        rows = tf.cast(rows, tf.float32)
    ones = tf.ones([1, tf.shape(rows)[0]], rows.dtype)
    return tf.cast(tf.reshape(tf.matmul(ones, rows), [-1]), dtype)


@functools.cache
def _bf16_matmul_sums_in_float32() -> bool:
    """Whether a bfloat16 matmul here accumulates in float32 and rounds once: on a GPU, and on a
    CPU with native bf16 (oneDNN). On a CPU without it (measured on an AMD EPYC with AVX2 only)
    TensorFlow's emulated bf16 matmul rounded partial sums: column sums of a [8192, 64] N(0, 1)
    bf16 tensor were off by up to 0.85 against sums of ~200, where one rounding is <= 0.5."""
    return bool(tensorflow_gpus()) or cpu_has_native_bf16()


def bias_add(x, bias):
    """``tf.nn.bias_add(x, bias)`` whose bias gradient is :func:`column_sum` of the incoming
    gradient instead of ``BiasAddGrad``; the forward op is the same BiasAdd, so TensorFlow
    still fuses it into the preceding MatMul."""

    @tf.custom_gradient
    def fn(x, bias):
        def grad(dy):
            return tf.identity(dy), tf.cast(column_sum(dy), bias.dtype)

        return tf.nn.bias_add(x, bias), grad

    return fn(x, tf.convert_to_tensor(bias))


# ------------------------------------------------------------------------------------ GELU
@tf.function(jit_compile=True, autograph=False)
def _gelu_forward(x):
    xf = _f32(x)
    return tf.cast(0.5 * xf * (1.0 + tf.math.erf(xf * _SQRT_HALF)), x.dtype)


@tf.function(jit_compile=True, autograph=False)
def _gelu_backward(x, dy):
    xf = _f32(x)
    cdf = 0.5 * (1.0 + tf.math.erf(xf * _SQRT_HALF))
    pdf = _INV_SQRT_2PI * tf.exp(-0.5 * xf * xf)
    return tf.cast(_f32(dy) * (cdf + xf * pdf), x.dtype)


@tf.function(jit_compile=True, autograph=False)
def _bias_gelu_forward(z, bias):
    return _gelu_forward(tf.cast(_f32(z) + _f32(bias), z.dtype))


@tf.function(jit_compile=True, autograph=False)
def _bias_gelu_backward(z, bias, dy):
    return _gelu_backward(tf.cast(_f32(z) + _f32(bias), z.dtype), dy)


def bias_gelu(z, bias):
    """GELU(z + bias), bias [d] added in float32 inside the kernel (a Dense layer's bias-add
    and activation in one pass). The bias gradient is :func:`column_sum`."""

    @tf.custom_gradient
    def fn(z, bias):
        def grad(dy):
            dz = _bias_gelu_backward(z, bias, dy)
            return dz, tf.cast(column_sum(dz), bias.dtype)

        return _bias_gelu_forward(z, bias), grad

    # A variable read here, not inside `fn` (custom_gradient refuses captured variables).
    return fn(z, tf.convert_to_tensor(bias))


# ------------------------------------------------------------------------------- layer norm
def _rows(x):
    """x [..., d] as float32 [rows, d] (inside a kernel: a reshape costs nothing)."""
    return tf.reshape(_f32(x), [-1, x.shape[-1]])


def _row_mean(t):
    """Mean over the last axis of [rows, d] as a dot with a constant column: XLA's CPU row
    reductions were the slow part of these kernels (layer-norm forward 1.2-2.2 ms vs 0.7 ms,
    backward 2.9-3.3 vs 1.5 ms for [8192, 256] bf16, 2 cores)."""
    d = t.shape[-1]
    return tf.matmul(t, tf.fill([d, 1], 1.0 / d))


@tf.function(jit_compile=True, autograph=False)
def _ln_forward(x, gamma, beta, epsilon):
    xf = _rows(x)
    centred = xf - _row_mean(xf)
    var = _row_mean(centred * centred)
    y = centred * tf.math.rsqrt(var + epsilon) * gamma + beta
    return tf.reshape(tf.cast(y, x.dtype), tf.shape(x))


@tf.function(jit_compile=True, autograph=False)
def _ln_backward(x, gamma, epsilon, dy):
    """dx, plus dy * x_hat in float32 for the gamma gradient: XLA's CPU column reductions
    over the batch x sequence rows were 4x slower than TensorFlow's, so the gamma and beta
    sums are left to :func:`column_sum` (see :func:`layer_norm`)."""
    xf, dyf = _rows(x), _rows(dy)
    centred = xf - _row_mean(xf)
    inv = tf.math.rsqrt(_row_mean(centred * centred) + epsilon)
    xhat = centred * inv
    g = dyf * gamma
    dx = inv * (g - _row_mean(g) - xhat * _row_mean(g * xhat))
    return tf.reshape(tf.cast(dx, x.dtype), tf.shape(x)), dyf * xhat


def layer_norm(x, gamma, beta, epsilon: float):
    """Layer norm over the last axis; ``gamma``/``beta`` float32 [d]. Returns ``x.dtype``."""
    eps = tf.constant(epsilon, tf.float32)

    @tf.custom_gradient
    def fn(x, gamma, beta):
        def grad(dy):
            dx, dy_xhat = _ln_backward(x, gamma, eps, dy)
            return dx, column_sum(dy_xhat), tf.cast(column_sum(dy), tf.float32)

        return _ln_forward(x, gamma, beta, eps), grad

    return fn(x, _f32(tf.convert_to_tensor(gamma)), _f32(tf.convert_to_tensor(beta)))


# ---------------------------------------------------------------------------------- dropout
def random_bytes(shape, seed) -> tf.Tensor:
    """One uniform random byte per element of ``shape`` (uint8), from the stateless Philox
    kernel; ``seed`` is an int64 [2] tensor."""
    size = tf.reduce_prod(shape)
    words = tf.random.stateless_uniform(
        [(size + 3) // 4], seed=seed, minval=None, maxval=None, dtype=tf.int32
    )
    return tf.reshape(tf.reshape(tf.bitcast(words, tf.uint8), [-1])[:size], shape)


@tf.function(jit_compile=True, autograph=False)
def _dropout_add_forward(x, h, noise, threshold, scale):
    kept = tf.where(noise >= threshold, _f32(h) * scale, 0.0)
    return tf.cast(_f32(x) + kept, x.dtype)


@tf.function(jit_compile=True, autograph=False)
def _bias_dropout_add_forward(x, h, bias, noise, threshold, scale):
    kept = tf.where(noise >= threshold, (_f32(h) + _f32(bias)) * scale, 0.0)
    return tf.cast(_f32(x) + kept, x.dtype)


@tf.function(jit_compile=True, autograph=False)
def _dropout_backward(noise, threshold, scale, dy):
    return tf.cast(tf.where(noise >= threshold, _f32(dy) * scale, 0.0), dy.dtype)


def dropout_add(x, h, noise, threshold: int, scale: float, bias=None):
    """``x + dropout(h)``: elements of ``h`` whose ``noise`` byte is below ``threshold`` are
    dropped, the rest multiplied by ``scale``.

    With ``bias`` [d]: ``x + dropout(h + bias)``, the bias added inside the kernel. A Dense
    layer's matmul followed by this is faster than the same matmul with its BiasAdd: TensorFlow
    fuses MatMul + BiasAdd into oneDNN's inner-product primitive, which ran at ~575 GFLOP/s in
    the training step against ~950 for the plain matmul primitive (``ONEDNN_VERBOSE``,
    benchmark Transformer)."""
    t = tf.constant(threshold, tf.uint8)
    s = tf.constant(scale, tf.float32)

    if bias is None:

        @tf.custom_gradient
        def fn(x, h):
            def grad(dy):
                return tf.identity(dy), tf.cast(_dropout_backward(noise, t, s, dy), h.dtype)

            return _dropout_add_forward(x, h, noise, t, s), grad

        return fn(x, h)

    @tf.custom_gradient
    def fn_bias(x, h, bias):
        def grad(dy):
            dh = tf.cast(_dropout_backward(noise, t, s, dy), h.dtype)
            return tf.identity(dy), dh, tf.cast(column_sum(dh), bias.dtype)

        return _bias_dropout_add_forward(x, h, bias, noise, t, s), grad

    return fn_bias(x, h, tf.convert_to_tensor(bias))


def dropout(h, noise, threshold: int, scale: float):
    """``dropout(h)`` with the same mask rule as :func:`dropout_add`."""
    t = tf.constant(threshold, tf.uint8)
    s = tf.constant(scale, tf.float32)

    @tf.custom_gradient
    def fn(h):
        def grad(dy):
            return _dropout_backward(noise, t, s, dy)

        return _dropout_backward(noise, t, s, h), grad

    return fn(h)


# -------------------------------------------------------------------- masked softmax+dropout
def _masked_value(dtype: tf.DType) -> float:
    """What Keras' ``Softmax(mask=...)`` adds where the mask is False: -1e9, but -3e4 in
    float16, where -1e9 is -inf and a row with every key masked would become NaN."""
    return -3e4 if dtype == tf.float16 else -1e9


def masked_softmax_dropout(scores, mask, noise, threshold: int, scale: float):
    """softmax over the last axis with ``mask`` (bool, broadcastable to ``scores``; False =
    excluded, as Keras' ``Softmax(mask=...)``), then dropout by ``noise`` bytes (see
    :func:`dropout_add`; ``noise=None``: no dropout).

    The softmax itself is TensorFlow's (oneDNN's kernel, in the scores' dtype, measured 2-3x
    faster than an XLA softmax here); the mask becomes an additive bias the size of the mask,
    and the dropout an XLA kernel that reuses its bytes in the backward pass."""
    bias = tf.where(tf.cast(mask, tf.bool), 0.0, _masked_value(scores.dtype))
    probs = tf.nn.softmax(scores + tf.cast(bias, scores.dtype), axis=-1)
    if noise is None:
        return probs
    return dropout(probs, noise, threshold, scale)
