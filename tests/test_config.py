"""The config: defaults, presets, YAML, overrides, and errors that name the field."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from fullthrottle.core.config import (
    PRESETS,
    BeamConfig,
    Config,
    StepResources,
    load_config,
    parse_override,
    validate_section,
)
from fullthrottle.core.errors import ConfigError
from trainer_module.training.config import TrainingConfig


def test_default_config_is_the_bundled_penguins_run():
    config = load_config()
    assert config == Config()
    assert config.data.path == "palmerpenguins"
    assert config.data.label == "species"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model_name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_derive_from_the_default(preset):
    config = load_config(preset=preset)
    default = Config()
    # A preset changes training fields only; data, evaluation and beam stay the default's.
    assert config.data == default.data
    assert config.beam == default.beam
    changed = {
        f.name
        for f in dataclasses.fields(config.training)
        if getattr(config.training, f.name) != getattr(default.training, f.name)
    }
    assert changed <= set(PRESETS[preset]["training"])
    assert config.training.strategy == PRESETS[preset]["training"]["strategy"]


def test_yaml_file_then_overrides(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("a,b\n1,2\n")
    path = tmp_path / "c.yaml"
    path.write_text(
        "model_name: mine\n"
        "data:\n  path: data/x.csv\n  label: b\n  numeric: [a]\n  categorical: []\n"
        "training:\n  train_steps: 10\n  models:\n    tabular: {hidden_units: [8, 4]}\n"
    )
    config = load_config(path, overrides=["training.train_steps=20", "training.precision=float32"])
    assert config.model_name == "mine"
    # Relative data paths are relative to the config file, not the shell.
    assert config.data.path == str((tmp_path / "data" / "x.csv").resolve())
    assert config.training.train_steps == 20
    assert config.training.models["tabular"].hidden_units == (8, 4)
    assert config.training.precision == "float32"


def test_override_values_are_typed():
    assert parse_override("training.train_steps=5") == {"training": {"train_steps": 5}}
    assert parse_override("training.jit_compile=true") == {"training": {"jit_compile": True}}
    assert parse_override("beam.extra_args=[--a=1]") == {"beam": {"extra_args": ["--a=1"]}}
    with pytest.raises(ConfigError, match="field.path=value"):
        parse_override("training.train_steps")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "training.per_replica_batch_size=-4",
            "`training.per_replica_batch_size` must be > 0, got -4",
        ),
        (
            "training.jit_compile=maybe",
            "`training.jit_compile` must be true or false, got str 'maybe'",
        ),
        ("data.numeric=bill_length_mm", "`data.numeric` must be a list, got str 'bill_length_mm'"),
        ("data.label=island", "in `data`: the label column 'island' is also listed as a feature"),
        (
            "evaluation.accuracy_threshold=2",
            "`evaluation.accuracy_threshold` must be within [0, 1], got 2",
        ),
        (
            "model_name=../etc",
            "`model_name` must be a non-empty name of letters, digits, '_' or '-', got '../etc'",
        ),
        (
            "beam.extra_args=[runner=Flink]",
            "`beam.extra_args[0]` must look like --flag=value, got 'runner=Flink'",
        ),
        (
            "serving.warmup_requests=2000",
            "`serving.warmup_requests` must be within [0, 1000] (TF Serving reads at most 1000), "
            "got 2000",
        ),
        (
            "serving.rest_port=8500",
            "`serving.rest_port` must differ from `grpc_port`, both are 8500",
        ),
        (
            "data.text=[{name: t, tokenizer: bpe}]",
            "`data.text[0].tokenizer` must be 'word' or 'char', got 'bpe'",
        ),
        ("data.text=[{tokenizer: char}]", "`data.text[0].name` is required"),
        ("kubeflow=3", "`kubeflow` must be a mapping of fields, got int 3"),
        ("training.cache=5", "`training.cache` must be true or false or a string, got int 5"),
        # Nothing is coerced: a boolean is not a step count, a quoted number not an integer.
        ("training.train_steps=true", "`training.train_steps` must be an integer, got bool True"),
        ("training.train_steps='5'", "`training.train_steps` must be an integer, got str '5'"),
        ("enable_cache=1", "`enable_cache` must be true or false, got int 1"),
    ],
)
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("override", "path", "suggestion", "known"),
    [
        ("training.train_stepz=3", "training.train_stepz", "train_steps", "train_steps"),
        ("trainig.train_steps=3", "trainig", "training", "tracking, training"),
        (
            "kubeflow.tfjob.resorces.cpu_request=2",
            "kubeflow.tfjob.resorces",
            "resources",
            "clean_pod_policy, enabled, image, poll_seconds, resources, service_account, "
            "timeout_minutes, workers",
        ),
        (
            "data.text=[{name: t, tokenzier: char}]",
            "data.text[0].tokenzier",
            "tokenizer",
            "lowercase, max_tokens, name, tokenizer, vocab_size",
        ),
    ],
)
def test_unknown_keys_at_any_depth_suggest_the_closest(override, path, suggestion, known):
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    message = str(info.value)
    assert message.startswith(f"unknown config key `{path}` (did you mean `{suggestion}`?); ")
    assert known in message.split("known keys here: ", 1)[1]


@pytest.mark.parametrize("quantity", ["1e3", "500m", "1.5Gi", "2", "0.5", "16Gi"])
def test_kubernetes_quantities_are_read_by_kubernetes_rules(quantity):
    config = load_config(
        overrides=[
            f"kubeflow.resources.trainer.cpu_request={quantity}",
            f"kubeflow.tfjob.resources.memory_limit={quantity}",
        ]
    )
    # Kept as the text the user wrote (YAML numbers as Kubernetes writes them: 2, not 2.0).
    assert config.kubeflow.resources.trainer.cpu_request == quantity
    assert config.kubeflow.tfjob.resources.memory_limit == quantity


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "kubeflow.resources.trainer.cpu_request=2x",
            "`kubeflow.resources.trainer.cpu_request` must be a CPU quantity like '2', '0.5' or "
            "'500m', got '2x'",
        ),
        (
            "kubeflow.resources.default.cpu_limit=-1",
            "`kubeflow.resources.default.cpu_limit` must be a CPU quantity like '2', '0.5' or "
            "'500m', got -1",
        ),
        (
            "kubeflow.tfjob.resources.memory_request=1.5.5Gi",
            "`kubeflow.tfjob.resources.memory_request` must be a memory quantity like '512Mi' or "
            "'16Gi', got '1.5.5Gi'",
        ),
        (
            "kubeflow.resources.pusher.memory_limit=true",
            "`kubeflow.resources.pusher.memory_limit` must be a memory quantity like '512Mi' or "
            "'16Gi', got True",
        ),
    ],
)
def test_bad_kubernetes_quantities_are_refused_with_the_field_path(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    assert str(info.value) == message


def test_training_config_errors_surface_under_training():
    # TrainingConfig is the training library's own dataclass: its `__post_init__` raises the one
    # ConfigError with a bare field, and the config layer puts it under `training.`.
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["training.per_replica_batch_size=0"])
    assert str(info.value) == "`training.per_replica_batch_size` must be > 0, got 0"
    with pytest.raises(ConfigError) as info:
        TrainingConfig(per_replica_batch_size=0)
    assert info.value.field == "per_replica_batch_size"
    assert str(info.value) == "`per_replica_batch_size` must be > 0, got 0"
    # A model's own section (the registry's) is qualified the same way, at any depth.
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["training.models.transformer.d_model=66"])
    assert str(info.value) == (
        "`training.models.transformer.d_model` must be divisible by `heads` (4), got 66"
    )
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["training.models.transformer.dmodel=66"])
    assert str(info.value).startswith(
        "unknown config key `training.models.transformer.dmodel` (did you mean `d_model`?); "
    )
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["training.models.transformr.d_model=66"])
    assert str(info.value).startswith(
        "unknown model `training.models.transformr` (did you mean `transformer`?); "
    )
    # The Trainer rebuilds it from the JSON custom_config the same way (lists for tuples).
    rebuilt = validate_section(
        TrainingConfig, {"models": {"tabular": {"hidden_units": [8, 4]}}}, where="training"
    )
    assert rebuilt == TrainingConfig(models={"tabular": {"hidden_units": (8, 4)}})
    with pytest.raises(ConfigError) as info:
        validate_section(TrainingConfig, {"warmup_steps": -1}, where="training")
    assert str(info.value) == "`training.warmup_steps` must be >= 0, got -1"
    with pytest.raises(ConfigError, match=r"^unknown config key `training.seeed` \(did you mean"):
        validate_section(TrainingConfig, {"seeed": 1}, where="training")


def test_every_refused_field_is_named_in_one_message():
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["serving.keep_versions=-1", "tracking.retries=lots"])
    assert str(info.value) == (
        "`tracking.retries` must be an integer, got str 'lots'; "
        "`serving.keep_versions` must be >= 0 (0 keeps all), got -1"
    )


def test_sections_built_in_code_refuse_bad_values_with_config_error():
    with pytest.raises(ConfigError) as info:
        BeamConfig(direct_num_workers=-1)
    assert str(info.value) == "`direct_num_workers` must be >= 0 (0 = one per core), got -1"
    with pytest.raises(ConfigError, match=r"^`cpu_request` must be a CPU quantity"):
        dataclasses.replace(StepResources(), cpu_request="fast")
    with pytest.raises(dataclasses.FrozenInstanceError):
        BeamConfig().direct_num_workers = 2  # type: ignore[misc]


def test_config_error_keeps_its_field_through_pickling():
    error = ConfigError("must be > 0, got -4", field="per_replica_batch_size")
    assert str(error) == "`per_replica_batch_size` must be > 0, got -4"
    restored = pickle.loads(pickle.dumps(error))
    assert (str(restored), restored.field, restored.message) == (
        str(error),
        "per_replica_batch_size",
        "must be > 0, got -4",
    )
    assert ConfigError("a whole sentence").field is None


def test_to_dict_loads_back_to_the_same_config():
    # last_run.json keeps `to_dict()`; reading a run's config back must give the same Config.
    config = load_config(overrides=["kubeflow.resources.trainer.cpu_request=1e3"])
    assert validate_section(Config, config.to_dict()) == config


def test_config_file_errors_name_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("training:\n  warmup_steps: -1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: `training.warmup_steps` must be >= 0, got -1"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping of fields"):
        load_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="unknown preset"):
        load_config(preset="tpu")


def test_a_regression_task_needs_a_bar_on_the_error():
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["data.task=regression"])
    assert "set `evaluation.max_mae`" in str(info.value)
    config = load_config(overrides=["data.task=regression", "evaluation.max_mae=12.5"])
    assert config.data.task == "regression" and config.evaluation.max_mae == 12.5
    assert load_config().data.task == "classification"
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["data.task=regresion"])
    assert str(info.value) == (
        "`data.task` must be 'classification' or 'regression', got 'regresion'"
    )
