"""The config: defaults, presets, YAML, overrides, and errors that name the field."""

from __future__ import annotations

import dataclasses

import pytest

from fullthrottle.core.config import PRESETS, Config, load_config, parse_override
from fullthrottle.core.errors import ConfigError


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
            r"`training.per_replica_batch_size` must be > 0, got -4",
        ),
        (
            "training.train_stepz=3",
            r"unknown config key `training.train_stepz` \(did you mean `train_steps`\?\)",
        ),
        ("training.jit_compile=maybe", r"`training.jit_compile` must be true or false"),
        ("data.numeric=bill_length_mm", r"`data.numeric` must be a list"),
        ("data.label=island", r"label column 'island' is also listed as a feature"),
        (
            "evaluation.accuracy_threshold=2",
            r"`evaluation.accuracy_threshold` must be within \[0, 1\]",
        ),
        ("model_name=../etc", r"`model_name` must be a non-empty name"),
        (
            "beam.extra_args=[runner=Flink]",
            r"`beam.extra_args` entries must look like --flag=value",
        ),
    ],
)
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])


def test_config_file_errors_name_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("training:\n  warmup_steps: -1\n")
    with pytest.raises(ConfigError, match=rf"{path}: .*warmup_steps"):
        load_config(path)
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping of fields"):
        load_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="unknown preset"):
        load_config(preset="tpu")
