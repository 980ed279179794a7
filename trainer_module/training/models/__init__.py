"""The model registry: every model the trainer can build, by name.

A model is one module here (``tabular.py``, ``transformer.py``) defining a
:class:`~trainer_module.training.models.base.ModelSpec`: its options (the frozen dataclass of its
config section ``training.models.<name>``), its builder, its FLOPs per example and its advice
for the step-time advisor. :data:`MODELS` is the only list of them: config validation,
:func:`build_model`, ``TrainingConfig.resolved_model``, the advisor and the bench's FLOP count
all look a model up here.

Adding a model (say ``wide_deep``): write ``models/wide_deep.py`` with its options dataclass
(defaults for every field, checked in ``__post_init__`` with ``base.require``), ``build``,
``forward_flops`` (and ``advice``/``check_inputs`` if it has any), ending in
``MODEL = ModelSpec(name="wide_deep", ...)``; then add ``"wide_deep": wide_deep.MODEL`` to
:data:`MODELS`. It is then ``training.model: wide_deep`` with ``training.models.wide_deep``
options (tests/test_model_registry.py does exactly this with a model defined in the test).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import keras

from trainer_module.training.errors import ConfigError
from trainer_module.training.models import tabular, transformer
from trainer_module.training.models.base import Advice, ModelSpec
from trainer_module.training.precision import dtype_policy

if TYPE_CHECKING:
    from trainer_module.training.config import ModelInputs, TrainingConfig

MODELS: dict[str, ModelSpec] = {
    "tabular": tabular.MODEL,
    "transformer": transformer.MODEL,
}

__all__ = ["MODELS", "Advice", "ModelSpec", "auto_model", "build_model", "build_serving_model"]


def _did_you_mean(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def model_spec(name: str) -> ModelSpec:
    """The registered model ``name``; ConfigError naming ``model`` otherwise."""
    if name not in MODELS:
        known = sorted(MODELS)
        raise ConfigError(
            f"must be 'auto' or a registered model ({', '.join(known)}), got {name!r}"
            f"{_did_you_mean(name, known)}",
            field="model",
        )
    return MODELS[name]


def auto_model(model_inputs: ModelInputs) -> str:
    """What ``model: auto`` trains: the Transformer when there is text to read, else the MLP."""
    return transformer.NAME if model_inputs.text else tabular.NAME


def model_options(sections: Mapping[str, Any]) -> dict[str, Any]:
    """``training.models``, validated: each section (a mapping, or the model's options object)
    becomes that model's options; a registered model without a section gets its defaults.
    Refuses an unknown model or option, naming its path and the closest known name."""
    if not isinstance(sections, Mapping):
        raise ConfigError(
            f"must be a mapping of model name -> options, got {sections!r}", field="models"
        )
    known = sorted(MODELS)
    for name in sections:
        if name not in MODELS:
            raise ConfigError(
                f"unknown model {{field}}{_did_you_mean(str(name), known)}; the registered "
                f"models: {', '.join(known)}",
                field=f"models.{name}",
            )
    return {
        name: _section(spec, sections[name]) if name in sections else spec.options()
        for name, spec in MODELS.items()
    }


def _section(spec: ModelSpec, section: Any) -> Any:
    if isinstance(section, spec.options):
        return section
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"must be a mapping of its options, got {section!r}", field=f"models.{spec.name}"
        )
    fields = [f.name for f in dataclasses.fields(spec.options) if f.init]
    for key in section:
        if key not in fields:
            raise ConfigError(
                f"unknown config key {{field}}{_did_you_mean(str(key), fields)}; "
                f"the {spec.name} model's options: {', '.join(fields)}",
                field=f"models.{spec.name}.{key}",
            )
    return spec.options(**section)


def build_model(
    model_inputs: ModelInputs,
    config: TrainingConfig,
    policy_name: str = "float32",
    *,
    training: bool = False,
) -> keras.Model:
    """Build the configured model with layers computing in ``policy_name`` (call it inside
    ``strategy.scope()`` for training). Output: float32 class probabilities.

    ``training``: the graph that trains, with the model's training-only speed-ups (for the
    Transformer: fused kernels, padding trimming, as its options say); False: the plain graph
    that serves. Both have the same variables, so weights move freely between them."""
    name = config.resolved_model(model_inputs)
    return MODELS[name].build(
        model_inputs,
        config.model_options(name),
        config,
        dtype_policy(policy_name),
        training=training,
    )


def build_serving_model(
    model: keras.Model, model_inputs: ModelInputs, config: TrainingConfig
) -> keras.Model:
    """A float32 plain twin of ``model`` carrying its trained weights (mixed-precision graphs
    are slow on CPU servers, and float16 serving would change predictions). Built outside any
    strategy scope, so the result is a plain single-device model."""
    serving = build_model(model_inputs, config, "float32")
    serving.set_weights([w.astype("float32") for w in model.get_weights()])
    return serving
