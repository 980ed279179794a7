"""The one frozen, validated configuration of a fullthrottle run.

Built once at the edge (CLI flags, a YAML file, presets) and passed down. Every dataclass
validates itself in `__post_init__` and names the bad field; `load_config` additionally rejects
unknown keys and wrong types with the dotted path of the field (``training.per_replica_batch_size``).
Data-dependent checks (does the column exist in the CSV?) live in `fullthrottle.data`, and run
before the pipeline starts.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fullthrottle.errors import ConfigError, TrainingConfigError
from trainer_module.training.config import TrainingConfig

BUNDLED_PENGUINS = "palmerpenguins"
BUNDLED_TEXT = "bundled:text_topics"

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def _check_name(value: str, field_name: str) -> None:
    if not value or not set(value) <= _NAME_CHARS:
        raise ConfigError(
            f"`{field_name}` must be a non-empty name of letters, digits, '_' or '-', got {value!r}"
        )


@dataclass(frozen=True)
class TextColumn:
    """A free-text column, tokenized by Transform into a fixed-length sequence of ids."""

    name: str
    tokenizer: str = "word"  # "word" (whitespace) or "char" (Unicode characters: CJK works)
    max_tokens: int = 32
    vocab_size: int = 5000
    lowercase: bool = True

    def __post_init__(self) -> None:
        if self.tokenizer not in ("word", "char"):
            raise ConfigError(
                f"`text.tokenizer` of column {self.name!r} must be 'word' or 'char', got {self.tokenizer!r}"
            )
        if self.max_tokens <= 0:
            raise ConfigError(f"`text.max_tokens` must be > 0, got {self.max_tokens}")
        if self.vocab_size <= 0:
            raise ConfigError(f"`text.vocab_size` must be > 0, got {self.vocab_size}")


@dataclass(frozen=True)
class DataSpec:
    """What the data is: where it lives and what each column means."""

    path: str = BUNDLED_PENGUINS  # a CSV file or folder of CSVs, a TFRecord folder, or a bundled name
    format: str = "csv"  # "csv" or "tfrecord" (gzip or plain tf.Example records)
    label: str = "species"
    numeric: tuple[str, ...] = (
        "bill_length_mm",
        "bill_depth_mm",
        "flipper_length_mm",
        "body_mass_g",
    )
    categorical: tuple[str, ...] = ("island", "sex")
    text: tuple[TextColumn, ...] = ()
    # Cells equal to one of these are missing values (penguins.csv writes "NA").
    na_values: tuple[str, ...] = ("NA",)
    # Hash-bucket split of the input rows, e.g. train 3 : eval 1.
    train_buckets: int = 3
    eval_buckets: int = 1
    # A schema.pbtxt to import instead of inferring one with SchemaGen.
    schema_path: str | None = None

    def __post_init__(self) -> None:
        if self.format not in ("csv", "tfrecord"):
            raise ConfigError(f"`data.format` must be 'csv' or 'tfrecord', got {self.format!r}")
        if not self.label:
            raise ConfigError("`data.label` must name the label column")
        if self.train_buckets <= 0 or self.eval_buckets <= 0:
            raise ConfigError(
                "`data.train_buckets` and `data.eval_buckets` must both be > 0, got "
                f"{self.train_buckets} and {self.eval_buckets}"
            )
        names = [*self.numeric, *self.categorical, *(t.name for t in self.text)]
        if not names:
            raise ConfigError(
                "the data spec has no feature columns: list some under `data.numeric`, "
                "`data.categorical` or `data.text`"
            )
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise ConfigError(f"column {name!r} is listed twice in the data spec")
            if name == self.label:
                raise ConfigError(f"the label column {name!r} is also listed as a feature")
            seen.add(name)

    @property
    def feature_columns(self) -> tuple[str, ...]:
        return (*self.numeric, *self.categorical, *(t.name for t in self.text))

    @property
    def all_columns(self) -> tuple[str, ...]:
        return (*self.feature_columns, self.label)


@dataclass(frozen=True)
class BeamConfig:
    """Apache Beam options for the data components (ExampleGen, StatisticsGen, Transform, ...)."""

    # DirectRunner mode. "in_memory" is the default by measurement: on the bundled data the
    # whole pipeline took 17 s in memory and 47 s with multi_processing (worker start-up
    # dominates small data); multi_processing pays off on large inputs.
    direct_running_mode: str = "in_memory"  # "in_memory" | "multi_threading" | "multi_processing"
    direct_num_workers: int = 0  # 0 = one per core
    extra_args: tuple[str, ...] = ()  # passed verbatim, e.g. ("--runner=FlinkRunner", ...)

    def __post_init__(self) -> None:
        modes = ("in_memory", "multi_threading", "multi_processing")
        if self.direct_running_mode not in modes:
            raise ConfigError(
                f"`beam.direct_running_mode` must be one of {', '.join(modes)}, got {self.direct_running_mode!r}"
            )
        if self.direct_num_workers < 0:
            raise ConfigError(f"`beam.direct_num_workers` must be >= 0, got {self.direct_num_workers}")
        for arg in self.extra_args:
            if not arg.startswith("--"):
                raise ConfigError(f"`beam.extra_args` entries must look like --flag=value, got {arg!r}")


@dataclass(frozen=True)
class EvalConfig:
    """The Evaluator's blessing rule."""

    accuracy_threshold: float = 0.8

    def __post_init__(self) -> None:
        if not 0.0 <= self.accuracy_threshold <= 1.0:
            raise ConfigError(
                f"`evaluation.accuracy_threshold` must be within [0, 1], got {self.accuracy_threshold}"
            )


@dataclass(frozen=True)
class Config:
    """Everything one `fullthrottle run` needs."""

    pipeline_name: str = "fullthrottle-penguins"
    model_name: str = "penguins"
    output_dir: str = "runs"
    enable_cache: bool = True
    data: DataSpec = field(default_factory=DataSpec)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    beam: BeamConfig = field(default_factory=BeamConfig)

    def __post_init__(self) -> None:
        _check_name(self.pipeline_name, "pipeline_name")
        _check_name(self.model_name, "model_name")
        if not self.output_dir:
            raise ConfigError("`output_dir` must not be empty")

    # Derived paths: one place decides the layout of a run's output folder.
    @property
    def output_path(self) -> Path:
        return Path(self.output_dir).absolute()

    @property
    def pipeline_root(self) -> Path:
        return self.output_path / "pipeline_root" / self.pipeline_name

    @property
    def mlmd_path(self) -> Path:
        return self.output_path / "metadata" / f"{self.pipeline_name}.sqlite"

    @property
    def serving_dir(self) -> Path:
        return self.output_path / "serving" / self.model_name

    @property
    def staged_data_dir(self) -> Path:
        return self.output_path / "data" / self.pipeline_name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- presets --------------------------------------------------------------------------------
# Named hardware presets derive from the default by overriding a few fields; they never copy it.
PRESETS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType(
    {
        "cpu": {"training": {"strategy": "one_device", "precision": "auto"}},
        "gpu": {"training": {"strategy": "one_device", "precision": "auto", "jit_compile": True}},
        "multi_gpu": {"training": {"strategy": "mirrored", "precision": "auto", "jit_compile": True}},
        "multi_worker": {"training": {"strategy": "multi_worker", "precision": "auto"}},
    }
)


def _deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# --- building dataclasses from plain data, with errors that name the field -------------------
def _convert(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        errors = []
        for candidate in non_none:
            try:
                return _convert(value, candidate, where)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"`{where}` must be a mapping of fields, got {type(value).__name__}")
        return build_dataclass(annotation, value, where)
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"`{where}` must be a list, got {type(value).__name__} {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"`{where}` must have {len(args)} entries, got {len(value)}")
        return tuple(_convert(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(args, value, strict=True)))
    if origin in (dict, Mapping) or annotation in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"`{where}` must be a mapping, got {type(value).__name__}")
        return dict(value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"`{where}` must be true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"`{where}` must be an integer, got {type(value).__name__} {value!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"`{where}` must be a number, got {type(value).__name__} {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"`{where}` must be a string, got {type(value).__name__} {value!r}")
    if annotation is type(None):
        if value is None:
            return None
        raise ConfigError(f"`{where}` must be empty (null), got {value!r}")
    return value


def build_dataclass(cls: type, data: Mapping[str, Any], where: str = "") -> Any:
    """Builds dataclass `cls` from a mapping, rejecting unknown keys and wrong types by name."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in known:
            suggestion = _closest(str(key), known)
            hint = f" (did you mean `{suggestion}`?)" if suggestion else ""
            raise ConfigError(
                f"unknown config key `{path}`{hint}; known keys here: {', '.join(sorted(known))}"
            )
        kwargs[key] = _convert(value, hints[key], path)
    try:
        return cls(**kwargs)
    except TrainingConfigError as exc:
        message = str(exc)
        if where and f"`{where}." not in message:
            # "`per_replica_batch_size` must be > 0" -> "`training.per_replica_batch_size` must be > 0"
            fields = {f.name for f in dataclasses.fields(cls)}
            qualified = re.sub(
                r"`([A-Za-z_][A-Za-z0-9_]*)",
                lambda m: f"`{where}.{m.group(1)}" if m.group(1) in fields else m.group(0),
                message,
                count=1,
            )
            if qualified == message:
                qualified = f"in `{where}`: {message}"
            raise ConfigError(qualified) from None
        if not isinstance(exc, ConfigError):
            raise ConfigError(str(exc)) from None
        raise


def _closest(name: str, candidates: set[str]) -> str | None:
    import difflib

    matches = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def parse_override(text: str) -> dict[str, Any]:
    """Turns ``training.train_steps=200`` into ``{"training": {"train_steps": 200}}``.

    The value is read as YAML, so numbers, booleans, lists (``[a, b]``) and null work.
    """
    if "=" not in text:
        raise ConfigError(f"an override must look like field.path=value, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"an override must name a field before '=', got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"cannot read the value of override {text!r}: {exc}") from None
    result: dict[str, Any] = {}
    node = result
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return result


def load_config(
    path: str | Path | None = None,
    *,
    preset: str | None = None,
    overrides: typing.Sequence[str] = (),
) -> Config:
    """Default config, then the preset, then the YAML file, then `field=value` overrides."""
    data: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        data = _deep_merge(data, PRESETS[preset])
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist; create one with `fullthrottle init`")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if not isinstance(loaded, Mapping):
            raise ConfigError(f"config file {path} must hold a mapping of fields at the top level")
        # Relative data paths in a config file are relative to the file, not the shell.
        loaded = dict(loaded)
        data_section = loaded.get("data")
        if isinstance(data_section, Mapping):
            data_section = dict(data_section)
            for key in ("path", "schema_path"):
                value = data_section.get(key)
                if isinstance(value, str) and value and not value.startswith("bundled:") and value != BUNDLED_PENGUINS:
                    if not Path(value).is_absolute() and "://" not in value:
                        data_section[key] = str((path.parent / value).resolve())
            loaded["data"] = data_section
        data = _deep_merge(data, loaded)
    for text in overrides:
        data = _deep_merge(data, parse_override(text))
    try:
        return build_dataclass(Config, data)
    except TrainingConfigError as exc:
        if path is not None:
            raise ConfigError(f"{path}: {exc}") from None
        raise


def config_to_yaml(config: Config) -> str:
    def plain(value: Any) -> Any:
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return yaml.safe_dump(plain(config.to_dict()), sort_keys=False, allow_unicode=True)
