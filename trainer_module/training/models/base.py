"""What a model is to the registry (:class:`ModelSpec`), and the parts the models share.

A model is a name, a frozen options dataclass (its ``training.models.<name>`` config section,
validated in ``__post_init__`` with :func:`require`), a builder, a FLOPs-per-example estimate
(the bench's MFU) and its own advice for the step-time advisor. The shared parts: the Keras
inputs for ``ModelInputs``, the numeric and categorical features every model reads, and the
classifier on top (hidden Dense layers, then a float32 softmax, or for a regression label one
float32 linear unit).

Every layer gets its dtype policy passed explicitly (no global ``set_dtype_policy``), so the
same builder makes the mixed-precision training model and the float32 serving twin. The final
Dense+softmax is always float32: softmax/cross-entropy in bf16/fp16 loses the small
probabilities that the loss's log needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import keras
from keras import layers

from trainer_module.training.errors import ConfigError

if TYPE_CHECKING:
    from trainer_module.training.config import ModelInputs, TrainingConfig


@dataclass(frozen=True)
class Advice:
    """One suggestion of a model's own for the step-time advisor: set ``option`` (a field of
    the model's options) to ``value``, because ``why``."""

    option: str
    value: Any
    why: str


def _no_advice(options: Any, config: TrainingConfig) -> list[Advice]:
    return []


def _any_inputs(model_inputs: ModelInputs) -> str | None:
    return None


@dataclass(frozen=True)
class ModelSpec:
    """A model as the registry knows it.

    name:          its name in ``training.model`` and ``training.models``.
    options:       its frozen options dataclass (every field with a default).
    build:         ``build(model_inputs, options, config, policy, training=...)`` -> a Keras
                   model from the transformed features (a dict keyed by feature name) to float32
                   class probabilities. ``training``: the graph trains (training-only speed-ups
                   allowed); False builds the plain twin that serves, with the same variables.
    forward_flops: matmul FLOPs of one example's forward pass (2 per multiply-add).
    advice:        the advisor's suggestions about its options for a compute-bound run.
    check_inputs:  why ``model_inputs`` cannot feed it (None when they can).
    """

    name: str
    options: type
    build: Callable[..., keras.Model]
    forward_flops: Callable[[ModelInputs, Any, TrainingConfig], float]
    advice: Callable[[Any, TrainingConfig], list[Advice]] = _no_advice
    check_inputs: Callable[[ModelInputs], str | None] = _any_inputs


# --- validating an options section -------------------------------------------------------------
def require(cond: bool, model: str, option: str, message: str, value: object) -> None:
    """Raise ConfigError naming ``models.<model>.<option>`` (the path under ``training``)."""
    if not cond:
        raise ConfigError(f"{message}, got {value!r}", field=f"models.{model}.{option}")


def require_positive_int(model: str, option: str, value: object) -> None:
    require(
        isinstance(value, int) and not isinstance(value, bool),
        model,
        option,
        "must be an int",
        value,
    )
    require(value > 0, model, option, "must be > 0", value)  # type: ignore[operator]


def units(model: str, option: str, value: Sequence[int]) -> tuple[int, ...]:
    """Layer widths as a tuple (YAML gives a list), each a positive int, at least one."""
    ok = isinstance(value, (list, tuple)) and bool(value)
    ok = ok and all(isinstance(u, int) and not isinstance(u, bool) and u > 0 for u in value)
    require(ok, model, option, "must be a non-empty list of positive ints", value)
    return tuple(value)


# --- the parts every model shares -----------------------------------------------------------------
def keras_inputs(model_inputs: ModelInputs) -> dict[str, keras.KerasTensor]:
    """One Keras input per transformed feature: numeric float32 [batch], categorical int64
    [batch], text int64 [batch, seq_len] (0 = padding)."""
    inputs = {}
    for name in model_inputs.numeric:
        inputs[name] = keras.Input(shape=(), dtype="float32", name=name)
    for name in model_inputs.categorical:
        inputs[name] = keras.Input(shape=(), dtype="int64", name=name)
    for name, (_, seq_len) in model_inputs.text.items():
        inputs[name] = keras.Input(shape=(seq_len,), dtype="int64", name=name)
    return inputs


def tabular_features(
    inputs: dict[str, keras.KerasTensor],
    model_inputs: ModelInputs,
    config: TrainingConfig,
    policy: keras.DTypePolicy,
) -> list[keras.KerasTensor]:
    """Numeric features as columns + one ``embedding_dim`` embedding per categorical feature."""
    parts = []
    if model_inputs.numeric:
        numeric = [layers.Reshape((1,), dtype=policy)(inputs[n]) for n in model_inputs.numeric]
        parts.append(numeric[0] if len(numeric) == 1 else layers.Concatenate(dtype=policy)(numeric))
    for name, card in model_inputs.categorical.items():
        emb = layers.Embedding(card, config.embedding_dim, dtype=policy, name=f"emb_{name}")
        parts.append(emb(inputs[name]))
    return parts


def tabular_width(model_inputs: ModelInputs, config: TrainingConfig) -> int:
    """The width of :func:`tabular_features` concatenated."""
    return len(model_inputs.numeric) + config.embedding_dim * len(model_inputs.categorical)


def classifier(
    parts: Sequence[keras.KerasTensor],
    *,
    hidden_units: Sequence[int],
    model_inputs: ModelInputs,
    config: TrainingConfig,
    policy: keras.DTypePolicy,
) -> keras.KerasTensor:
    """``parts`` concatenated, then ReLU Dense layers (``dropout_rate`` after each), then the
    head: the float32 softmax over the classes or, for a regression label, one float32 linear
    unit scaled to the label (``label_mean + label_std * unit``), shape [batch, 1]."""
    x = parts[0] if len(parts) == 1 else layers.Concatenate(dtype=policy)(parts)
    for i, width in enumerate(hidden_units):
        x = layers.Dense(width, activation="relu", dtype=policy, name=f"dense{i}")(x)
        if config.dropout_rate:
            x = layers.Dropout(config.dropout_rate, dtype=policy)(x)
    # float32 regardless of the training policy (see the module docstring).
    if model_inputs.regression:
        unit = layers.Dense(1, dtype="float32", name="prediction_standardized")(x)
        return layers.Rescaling(
            scale=model_inputs.label_std,
            offset=model_inputs.label_mean,
            dtype="float32",
            name="prediction",
        )(unit)
    return layers.Dense(
        model_inputs.num_classes, activation="softmax", dtype="float32", name="probabilities"
    )(x)


def classifier_flops(width: int, hidden_units: Sequence[int], num_classes: int) -> float:
    """Forward matmul FLOPs of :func:`classifier` on a ``width``-wide input: 2·w_in·w_out per
    Dense layer, the head included (``num_classes``: its units, 1 for regression)."""
    flops = 0.0
    for units_out in hidden_units:
        flops += 2 * width * units_out
        width = units_out
    return flops + 2 * width * num_classes
