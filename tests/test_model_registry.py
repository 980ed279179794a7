"""The model registry is the only place a model is looked up: a model defined here, in the test,
and added to ``MODELS`` (one line) is validated by the config, built, trained, exported, advised
on and FLOP-counted by the bench, with no other change. And the registry's own refusals."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import keras
import numpy as np
import pytest
from keras import layers

from fullthrottle.bench.trainer import training_flops_per_example
from fullthrottle.bench.workloads import TrainingData
from fullthrottle.core.config import load_config
from tests.training_data import feature_spec, tabular_inputs, text_inputs, write_records
from trainer_module.training import MODELS, ConfigError, TrainingConfig, build_model, train
from trainer_module.training.advisor import BenchFigures, StepTimeMeasurements, advise
from trainer_module.training.hardware import DeviceFacts
from trainer_module.training.models import base


# --- a model of the test's own: one options dataclass, a builder, FLOPs, advice ----------------
@dataclass(frozen=True)
class ToyOptions:
    width: int = 8

    def __post_init__(self) -> None:
        base.require_positive_int("toy", "width", self.width)


def _build(model_inputs, options, config, policy, *, training):
    inputs = base.keras_inputs(model_inputs)
    parts = base.tabular_features(inputs, model_inputs, config, policy)
    x = parts[0] if len(parts) == 1 else layers.Concatenate(dtype=policy)(parts)
    x = layers.Dense(options.width, activation="tanh", dtype=policy, name="toy_hidden")(x)
    probabilities = layers.Dense(
        model_inputs.num_classes, activation="softmax", dtype="float32", name="probabilities"
    )(x)
    used = {k: v for k, v in inputs.items() if k not in model_inputs.text}
    return keras.Model(inputs=used, outputs=probabilities, name="fullthrottle_toy")


def _forward_flops(model_inputs, options, config):
    width = base.tabular_width(model_inputs, config)
    return 2 * width * options.width + 2 * options.width * model_inputs.num_classes


def _advice(options, config):
    if options.width >= 64:
        return []
    return [base.Advice("width", options.width * 2, "a wider toy learns more per step")]


def _check_inputs(model_inputs):
    return "`ModelInputs.text` is more than a toy can read" if model_inputs.text else None


TOY = base.ModelSpec(
    name="toy",
    options=ToyOptions,
    build=_build,
    forward_flops=_forward_flops,
    advice=_advice,
    check_inputs=_check_inputs,
)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(MODELS, "toy", TOY)  # the one registry line


def test_a_registered_model_is_configured_built_trained_advised_and_counted(toy, tmp_path):
    inputs = tabular_inputs()
    config = TrainingConfig(
        model="toy",
        models={"toy": {"width": 16}},
        per_replica_batch_size=32,
        train_steps=40,
        steps_per_loop=10,
        learning_rate=5e-3,
        precision="float32",
    )
    # Config: its section is validated by its own options, under its own path.
    assert config.models["toy"] == ToyOptions(width=16)
    assert TrainingConfig(model="toy").models["toy"] == ToyOptions()  # defaults
    with pytest.raises(ConfigError, match=r"`models\.toy\.width` must be > 0, got 0"):
        TrainingConfig(model="toy", models={"toy": {"width": 0}})
    with pytest.raises(ConfigError, match=r"`models\.toy\.widht` \(did you mean `width`\?\)"):
        TrainingConfig(model="toy", models={"toy": {"widht": 16}})
    with pytest.raises(ConfigError, match=r"`model` is 'toy' but `ModelInputs.text`"):
        config.resolved_model(text_inputs())
    # ... and from the project's YAML/--set config, with the path from `training`.
    project = load_config(overrides=["training.model=toy", "training.models.toy.width=4"])
    assert project.training.models["toy"].width == 4
    with pytest.raises(ConfigError, match=r"`training\.models\.toy\.widht`"):
        load_config(overrides=["training.models.toy.widht=4"])

    # Built by build_model, trained by train(), exported as its float32 twin.
    model = build_model(inputs, config)
    assert model.name == "fullthrottle_toy" and model.get_layer("toy_hidden").units == 16
    files = write_records(tmp_path / "train", inputs, files=1, per_file=256)
    result = train(
        config=config,
        model_inputs=inputs,
        feature_spec=feature_spec(inputs),
        train_files=files,
        eval_files=files,
        work_dir=str(tmp_path / "work"),
    )
    assert result.facts.model_kind == "toy" and result.facts.derived_params()["model"] == "toy"
    losses = [r["loss"] for r in result.history]
    assert losses[-1] < 0.9 * losses[0], losses
    assert result.serving_model.name == "fullthrottle_toy"
    batch = {k: np.ones(2, np.float32) for k in inputs.numeric} | {"cat": np.array([0, 3])}
    np.testing.assert_allclose(
        result.serving_model(batch).numpy(), result.model(batch).numpy(), rtol=1e-6
    )

    # The advisor asks the registry for the model's own levers (a compute-bound run of it), and
    # offers one where the benchmark measured it faster for this model and precision.
    device = DeviceFacts(cpu_flags=frozenset({"avx512_bf16"}), cpu_count=2)
    measured = StepTimeMeasurements(
        0.2, 0.001, 100, 3, 64, "float32", model_kind=result.facts.model_kind
    )
    lever = {"model": "toy", "precision": "float32", "field": "models.toy.width", "value": 32}
    figures = BenchFigures(
        {"device": {"kind": "cpu"}, "levers": [{**lever, "ratio": 1.2, "interval": None}]}
    )
    report = advise(measured, config, device, figures)
    items = {item["field"]: item["value"] for item in report["advice"]}
    assert items["training.models.toy.width"] == 32
    assert not any("transformer" in field for field in items)
    wide = config.with_model_options("toy", width=64)
    assert "training.models.toy.width" not in {
        item["field"] for item in advise(measured, wide, device, figures)["advice"]
    }
    # Without a figure of the toy model's: not advised.
    assert "training.models.toy.width" not in {
        item["field"] for item in advise(measured, config, device, BenchFigures())["advice"]
    }

    # The bench's FLOP count is the registry's.
    data = TrainingData(
        name="toy",
        train_files=tuple(files),
        examples_uri=str(tmp_path),
        feature_spec=feature_spec(inputs),
        schema=None,
        model_inputs=inputs,
    )
    width = len(inputs.numeric) + config.embedding_dim * len(inputs.categorical)
    forward = 2 * width * 16 + 2 * 16 * inputs.num_classes
    assert training_flops_per_example(data, config) == {"forward": forward, "training": 3 * forward}


def test_unknown_models_and_options_are_refused_with_the_closest_name():
    with pytest.raises(ConfigError, match=r"`model` must be 'auto' or a registered model"):
        TrainingConfig(model="transformr")
    with pytest.raises(ConfigError, match=r"`models\.tabluar` \(did you mean `tabular`\?\)"):
        TrainingConfig(models={"tabluar": {}})
    with pytest.raises(ConfigError, match=r"`models\.transformer` must be a mapping"):
        TrainingConfig(models={"transformer": 3})
    with pytest.raises(ConfigError, match=r"`training\.models\.transformer\.heads` must be"):
        load_config(overrides=["training.models.transformer.heads=-1"])


def test_auto_is_decided_by_the_registry_and_sections_keep_their_defaults():
    config = TrainingConfig(models={"transformer": {"layers": 1}})
    assert config.resolved_model(text_inputs()) == "transformer"
    assert config.resolved_model(tabular_inputs()) == "tabular"
    assert config.models["transformer"].layers == 1 and config.models["transformer"].d_model == 64
    assert config.models["tabular"].hidden_units == (64, 64)  # a list in YAML becomes a tuple
    changed = config.with_model_options("transformer", fused_kernels=False)
    assert (
        changed.models["transformer"].layers == 1
        and not changed.models["transformer"].fused_kernels
    )
    assert config.models["transformer"].fused_kernels  # the original is unchanged (frozen)


@pytest.mark.parametrize(
    "classifier_inputs", [tabular_inputs, text_inputs], ids=["tabular", "text"]
)
def test_every_model_gets_a_regression_head_in_float32(classifier_inputs):
    classes = classifier_inputs()
    inputs = dataclasses.replace(
        classes, task="regression", num_classes=1, label_mean=150.0, label_std=75.0
    )
    config = TrainingConfig(models={"transformer": {"layers": 1, "d_model": 16, "heads": 2}})
    model = build_model(inputs, config, "mixed_bfloat16", training=True)
    head = model.get_layer("prediction")
    assert head.dtype_policy.name == "float32"
    assert model.get_layer("prediction_standardized").dtype_policy.name == "float32"
    assert tuple(model.output.shape) == (None, 1) and model.output.dtype == "float32"
    # The head predicts label_mean + label_std x its unit: a zero unit answers the mean.
    unit = model.get_layer("prediction_standardized")
    unit.set_weights([np.zeros_like(w) for w in unit.get_weights()])
    batch = {name: np.zeros((2, *spec.shape[1:]), spec.dtype) for name, spec in model.input.items()}
    np.testing.assert_array_equal(model(batch).numpy(), [[150.0], [150.0]])
    # One output unit instead of the classes in the FLOP count.
    name = config.resolved_model(inputs)
    flops = MODELS[name].forward_flops(inputs, config.model_options(name), config)
    assert flops < MODELS[name].forward_flops(classes, config.model_options(name), config)
