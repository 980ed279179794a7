"""What the trainer is told: the shape of the transformed data (``ModelInputs``) and how to
train on it (``TrainingConfig``).

Both are frozen dataclasses validated in ``__post_init__``: a bad value fails at construction,
with a :class:`ConfigError` naming the field, long before any TensorFlow work starts. Checks
that need the runtime (number of replicas) live in :func:`resolve_batch_sizes`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer_module.training import models as registry
from trainer_module.training.errors import ConfigError

PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker")
OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")
LR_SCALINGS = ("linear", "none")
RESUME_DATA = ("skip", "reseed")
UNREADABLE_CHECKPOINTS = ("fail", "start_over")
TASKS = ("classification", "regression")
REGRESSION_LOSSES = ("mse", "huber")


def _require(cond: bool, name: str, message: str, value: object) -> None:
    if not cond:
        raise ConfigError(f"{message}, got {value!r}", field=name)


@dataclass(frozen=True)
class ModelInputs:
    """The transformed features the model reads, as described by the pipeline.

    numeric:     float32 features of shape [] per example.
    categorical: int64 id features of shape [] -> cardinality (ids in [0, cardinality)).
    text:        int64 token-id sequences -> (vocab_size, seq_len); id 0 is padding.
    label:       classification: int64 class-id feature of shape []; regression: float32 [].
    num_classes: the classes of a classification label (unused for regression).
    task:        "classification" (softmax over ``num_classes``) or "regression" (one number).
    label_mean, label_std: regression only: the training labels' mean and standard deviation.
                 The regression head predicts ``label_mean + label_std * z`` so that its Dense
                 unit learns a standardized target (Adam's steps are ~learning_rate: a raw target
                 of mean 150 would take 10**5 steps just to reach its mean).
    """

    numeric: tuple[str, ...] = ()
    categorical: Mapping[str, int] = field(default_factory=dict)
    text: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    label: str = "label"
    num_classes: int = 2
    task: str = "classification"
    label_mean: float = 0.0
    label_std: float = 1.0

    def __post_init__(self) -> None:
        # Own copies (plain dicts/tuples stay picklable), so the caller's later edits don't leak in.
        object.__setattr__(self, "numeric", tuple(self.numeric))
        object.__setattr__(self, "categorical", {k: int(v) for k, v in self.categorical.items()})
        object.__setattr__(
            self, "text", {k: tuple(int(x) for x in v) for k, v in self.text.items()}
        )
        _require(self.task in TASKS, "task", f"must be one of {', '.join(TASKS)}", self.task)
        if self.task == "classification":
            _require(self.num_classes >= 2, "num_classes", "must be >= 2", self.num_classes)
        else:
            _require(
                math.isfinite(self.label_mean), "label_mean", "must be finite", self.label_mean
            )
            _require(
                math.isfinite(self.label_std) and self.label_std > 0,
                "label_std",
                "must be finite and > 0",
                self.label_std,
            )
        _require(bool(self.label), "label", "must be a feature name", self.label)
        for name, card in self.categorical.items():
            _require(card > 0, f"categorical[{name!r}]", "cardinality must be > 0", card)
        for name, vs in self.text.items():
            _require(
                len(vs) == 2 and vs[0] > 1 and vs[1] > 0,
                f"text[{name!r}]",
                "must be (vocab_size > 1, seq_len > 0)",
                vs,
            )
        names = [*self.numeric, *self.categorical, *self.text]
        dup = {n for n in names if names.count(n) > 1}
        _require(not dup, "ModelInputs", "feature names must be unique", sorted(dup))
        _require(self.label not in names, "label", "must not also be a model input", self.label)
        _require(bool(names), "ModelInputs", "must name at least one input feature", names)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return (*self.numeric, *self.categorical, *self.text)

    @property
    def regression(self) -> bool:
        return self.task == "regression"

    @property
    def output_units(self) -> int:
        """The width of the model's output: the classes, or one number for regression."""
        return 1 if self.regression else self.num_classes


@dataclass(frozen=True)
class TrainingConfig:
    """How to train. Every field has a working default; ``None``/"auto" means automatic."""

    # A registered model (models.MODELS: "tabular", "transformer"), or "auto": the registry
    # decides from the inputs (the Transformer iff there is text).
    model: str = "auto"
    per_replica_batch_size: int = 64
    # If set, wins over per_replica_batch_size: per-replica batch is derived from it and must
    # divide evenly by (replicas x gradient_accumulation_steps) at run time.
    global_batch_size: int | None = None
    gradient_accumulation_steps: int = 1
    train_steps: int = 400
    eval_steps: int | None = None  # None = the eval files once
    steps_per_loop: int = 50
    learning_rate: float = 1e-3  # at `learning_rate_base_batch`
    learning_rate_base_batch: int = 64
    learning_rate_scaling: str = "linear"
    warmup_steps: int = 0
    optimizer: str = "adam"
    precision: str = "auto"
    loss_scale_initial: float = 2.0**15  # float16 only: dynamic loss scale starting value
    loss_scale_growth_steps: int = 2000  # float16 only: finite steps before doubling the scale
    jit_compile: bool = False
    run_eagerly: bool = False  # debugging / tests: no tf.function around the loop
    strategy: str = "auto"
    num_logical_cpu_devices: int = 0
    checkpoint_every_steps: int = 100  # 0 = only at the end
    checkpoint_every_seconds: float | None = None
    checkpoints_to_keep: int = 3
    # Periodic saves run TF's checkpoint write as one traced function instead of walking the
    # object graph eagerly at each save (training/checkpoints.py; same files). Single-host only:
    # multi-worker runs always save eagerly. False is TF's plain eager save.
    traced_checkpoint_saves: bool = True
    # When checkpoints exist but none can be read (all moved to `checkpoints/unreadable/`):
    # "fail" says so and stops; "start_over" trains from step 0.
    unreadable_checkpoints: str = "fail"
    # Input pipeline.
    shuffle_files: bool = True
    shuffle_buffer_size: int = 10_000  # 0 = no record shuffle
    interleave_cycle_length: int | None = None
    num_parallel_calls: int | None = None
    # True / False, or "auto": cache when the training files are small relative to RAM
    # (inputs.resolve_cache: compressed bytes x 20 <= 10% of physical RAM).
    cache: bool | str = "auto"
    prefetch_buffer_size: int | None = None
    deterministic_input: bool | None = None  # None = same as `deterministic`
    resume_data: str = "skip"  # "skip": replay the seeded order up to the step; "reseed"
    # Streaming input only: a folder where a pre-batched copy of each training file is kept
    # (one tf.Example per 1,024 parsed rows; inputs.prebatched_path: keyed by the file's name,
    # size and modification time and the parsed features). Written once before training; every
    # epoch and every later run on the same Transform output reads one record per chunk
    # instead of one per row. None = off.
    input_snapshot_dir: str | None = None
    # Models: each registered model's own options, by model name (``models: {transformer:
    # {layers: 2, ...}, tabular: {hidden_units: [64, 64]}}``; see models/<name>.py). Missing
    # sections and options take their defaults. The two below are shared by every model.
    models: Mapping[str, Any] = field(default_factory=dict)
    embedding_dim: int = 8  # width of each categorical feature's embedding
    dropout_rate: float = 0.1
    # Regression only (`data.task: regression`): "mse" (squared error) or "huber" (squared
    # below `huber_delta`, absolute beyond: robust to outlying labels), in the label's units.
    regression_loss: str = "mse"
    huber_delta: float = 1.0
    profile_steps: tuple[int, int] | None = None
    seed: int = 42
    deterministic: bool = False

    def __post_init__(self) -> None:
        if self.profile_steps is not None:
            object.__setattr__(self, "profile_steps", tuple(self.profile_steps))
        r = _require
        if self.model != "auto":
            registry.model_spec(self.model)
        object.__setattr__(self, "models", registry.model_options(self.models))
        r(self.precision in PRECISIONS, "precision", f"must be one of {PRECISIONS}", self.precision)
        r(self.strategy in STRATEGIES, "strategy", f"must be one of {STRATEGIES}", self.strategy)
        r(self.optimizer in OPTIMIZERS, "optimizer", f"must be one of {OPTIMIZERS}", self.optimizer)
        r(
            self.learning_rate_scaling in LR_SCALINGS,
            "learning_rate_scaling",
            f"must be one of {LR_SCALINGS}",
            self.learning_rate_scaling,
        )
        r(
            self.resume_data in RESUME_DATA,
            "resume_data",
            f"must be one of {RESUME_DATA}",
            self.resume_data,
        )
        r(
            self.unreadable_checkpoints in UNREADABLE_CHECKPOINTS,
            "unreadable_checkpoints",
            f"must be one of {UNREADABLE_CHECKPOINTS}",
            self.unreadable_checkpoints,
        )
        r(
            self.cache is True or self.cache is False or self.cache == "auto",
            "cache",
            "must be true, false or 'auto'",
            self.cache,
        )
        for name in (
            "per_replica_batch_size",
            "gradient_accumulation_steps",
            "train_steps",
            "steps_per_loop",
            "learning_rate_base_batch",
            "checkpoints_to_keep",
            "embedding_dim",
            "loss_scale_growth_steps",
        ):
            v = getattr(self, name)
            r(isinstance(v, int) and not isinstance(v, bool), name, "must be an int", v)
            r(v > 0, name, "must be > 0", v)
        for name in ("warmup_steps", "checkpoint_every_steps", "shuffle_buffer_size", "seed"):
            v = getattr(self, name)
            r(isinstance(v, int) and not isinstance(v, bool), name, "must be an int", v)
            r(v >= 0, name, "must be >= 0", v)
        for name in (
            "global_batch_size",
            "eval_steps",
            "interleave_cycle_length",
            "num_parallel_calls",
            "prefetch_buffer_size",
        ):
            v = getattr(self, name)
            if v is not None:
                r(isinstance(v, int) and not isinstance(v, bool), name, "must be an int or None", v)
                r(v > 0, name, "must be > 0 (or None for automatic)", v)
        r(
            isinstance(self.num_logical_cpu_devices, int) and self.num_logical_cpu_devices >= 0,
            "num_logical_cpu_devices",
            "must be an int >= 0",
            self.num_logical_cpu_devices,
        )
        r(
            math.isfinite(self.learning_rate) and self.learning_rate > 0,
            "learning_rate",
            "must be a finite number > 0",
            self.learning_rate,
        )
        r(
            math.isfinite(self.loss_scale_initial) and self.loss_scale_initial >= 1,
            "loss_scale_initial",
            "must be >= 1",
            self.loss_scale_initial,
        )
        r(0.0 <= self.dropout_rate < 1.0, "dropout_rate", "must be in [0, 1)", self.dropout_rate)
        r(
            self.regression_loss in REGRESSION_LOSSES,
            "regression_loss",
            f"must be one of {REGRESSION_LOSSES}",
            self.regression_loss,
        )
        r(
            math.isfinite(self.huber_delta) and self.huber_delta > 0,
            "huber_delta",
            "must be a finite number > 0",
            self.huber_delta,
        )
        if self.input_snapshot_dir is not None:
            r(
                isinstance(self.input_snapshot_dir, str) and bool(self.input_snapshot_dir),
                "input_snapshot_dir",
                "must be a folder path or None",
                self.input_snapshot_dir,
            )
        if self.checkpoint_every_seconds is not None:
            r(
                self.checkpoint_every_seconds > 0,
                "checkpoint_every_seconds",
                "must be > 0 or None",
                self.checkpoint_every_seconds,
            )
        if self.profile_steps is not None:
            p = self.profile_steps
            r(
                len(p) == 2 and 0 <= p[0] < p[1],
                "profile_steps",
                "must be (start, stop) with 0 <= start < stop",
                p,
            )
        if self.global_batch_size is not None:
            k = self.gradient_accumulation_steps
            r(
                self.global_batch_size % k == 0,
                "global_batch_size",
                f"must be divisible by `gradient_accumulation_steps` ({k})",
                self.global_batch_size,
            )
            if self.num_logical_cpu_devices > 1:
                n = self.num_logical_cpu_devices * k
                r(
                    self.global_batch_size % n == 0,
                    "global_batch_size",
                    f"must be divisible by `num_logical_cpu_devices` x "
                    f"`gradient_accumulation_steps` ({n})",
                    self.global_batch_size,
                )

    @property
    def input_deterministic(self) -> bool:
        return self.deterministic if self.deterministic_input is None else self.deterministic_input

    def resolved_model(self, model_inputs: ModelInputs) -> str:
        """The model to train on ``model_inputs`` ("auto" resolved by the registry); refuses a
        model the inputs cannot feed."""
        name = registry.auto_model(model_inputs) if self.model == "auto" else self.model
        why_not = registry.model_spec(name).check_inputs(model_inputs)
        if why_not:
            raise ConfigError(f"`model` is {name!r} but {why_not}")
        return name

    def model_options(self, name: str) -> Any:
        """The options of registered model ``name`` (``models.<name>``, defaults filled in)."""
        spec = registry.model_spec(name)
        return self.models.get(name) or spec.options()

    def with_model_options(self, name: str, **changes: Any) -> TrainingConfig:
        """This config with some of model ``name``'s options changed."""
        options = dataclasses.replace(self.model_options(name), **changes)
        return dataclasses.replace(self, models={**self.models, name: options})


@dataclass(frozen=True)
class BatchSizes:
    """Batch arithmetic resolved against the running strategy."""

    per_replica: int  # examples per replica per micro-batch
    accumulation_steps: int
    num_replicas: int

    @property
    def per_replica_step(self) -> int:  # examples one replica consumes per optimizer step
        return self.per_replica * self.accumulation_steps

    @property
    def global_batch(self) -> int:
        return self.per_replica * self.accumulation_steps * self.num_replicas


def resolve_batch_sizes(config: TrainingConfig, num_replicas: int) -> BatchSizes:
    """global = per_replica x replicas x accumulation; refuses a global batch that won't split."""
    k = config.gradient_accumulation_steps
    if config.global_batch_size is None:
        return BatchSizes(config.per_replica_batch_size, k, num_replicas)
    per, rem = divmod(config.global_batch_size, num_replicas * k)
    if rem or per == 0:
        raise ConfigError(
            f"`global_batch_size` ({config.global_batch_size}) must be a positive multiple of "
            f"replicas ({num_replicas}) x `gradient_accumulation_steps` ({k}) = {num_replicas * k}"
        )
    return BatchSizes(per, k, num_replicas)


def scaled_learning_rate(config: TrainingConfig, global_batch: int) -> float:
    """Linear scaling rule (Goyal et al. 2017): lr x global_batch / base_batch."""
    if config.learning_rate_scaling == "none":
        return config.learning_rate
    return config.learning_rate * global_batch / config.learning_rate_base_batch
