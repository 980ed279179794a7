"""The tabular model: an MLP over the numeric features and the categorical embeddings.

Config section ``training.models.tabular``: ``hidden_units`` (the MLP's widths). Text columns
are not read (the Transformer reads them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import keras

from trainer_module.training.models.base import (
    ModelSpec,
    classifier,
    classifier_flops,
    keras_inputs,
    tabular_features,
    tabular_width,
    units,
)

if TYPE_CHECKING:
    from trainer_module.training.config import ModelInputs, TrainingConfig

NAME = "tabular"


@dataclass(frozen=True)
class TabularOptions:
    hidden_units: tuple[int, ...] = (64, 64)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden_units", units(NAME, "hidden_units", self.hidden_units))


def check_inputs(model_inputs: ModelInputs) -> str | None:
    if not (model_inputs.numeric or model_inputs.categorical):
        return "`ModelInputs` names no numeric or categorical column (it reads no text)"
    return None


def build(
    model_inputs: ModelInputs,
    options: TabularOptions,
    config: TrainingConfig,
    policy: keras.DTypePolicy,
    *,
    training: bool,
) -> keras.Model:
    inputs = keras_inputs(model_inputs)
    parts = tabular_features(inputs, model_inputs, config, policy)
    probabilities = classifier(
        parts,
        hidden_units=options.hidden_units,
        model_inputs=model_inputs,
        config=config,
        policy=policy,
    )
    used = {k: v for k, v in inputs.items() if k not in model_inputs.text}
    return keras.Model(inputs=used, outputs=probabilities, name=f"fullthrottle_{NAME}")


def forward_flops(
    model_inputs: ModelInputs, options: TabularOptions, config: TrainingConfig
) -> float:
    """The MLP's matmuls: 2·w_in·w_out per Dense layer (the first takes the numeric features
    and ``embedding_dim`` per categorical feature), the softmax head included."""
    return classifier_flops(
        tabular_width(model_inputs, config), options.hidden_units, model_inputs.output_units
    )


MODEL = ModelSpec(
    name=NAME,
    options=TabularOptions,
    build=build,
    forward_flops=forward_flops,
    check_inputs=check_inputs,
)
