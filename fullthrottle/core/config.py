"""The one frozen, validated configuration of a fullthrottle run.

Built once at the edge (CLI flags, a YAML file, presets) and passed down. Every section is a
frozen pydantic dataclass: types and ranges are declared on the fields, rules across fields live
in `__post_init__`, and unknown keys are refused. Whatever is refused, from YAML (`load_config`), a
component's custom_config (`validate_section`) or Python code, becomes one `ConfigError` naming the
dotted field path, the value and what it must be (``training.per_replica_batch_size``).
Data-dependent checks (does the column exist in the CSV?) live in `fullthrottle.core.staging`, and
run before the pipeline starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import re
import string
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml
from kubernetes.utils import parse_quantity
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
)

from fullthrottle.core.errors import ConfigError
from fullthrottle.core.features import check_internal_names
from fullthrottle.core.object_stores import check_location, scheme_of
from fullthrottle.core.paths import missing_path_message
from trainer_module.training.config import TrainingConfig

BUNDLED_PENGUINS = "palmerpenguins"
BUNDLED_TEXT = "bundled:text_topics"
BUNDLED_DIABETES = "bundled:diabetes"


@typing.dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def _section[T](cls: type[T]) -> type[T]:
    """A frozen pydantic dataclass that refuses unknown keys and whose constructor raises
    `ConfigError` (not pydantic's ValidationError), as loading a config file does."""
    section = pydantic.dataclasses.dataclass(cls, frozen=True, config={"extra": "forbid"})
    validate = section.__init__

    @functools.wraps(validate)
    def checked_init(self, *args: Any, **kwargs: Any) -> None:
        try:
            validate(self, *args, **kwargs)
        except ValidationError as exc:
            raise config_error(exc, section) from None

    section.__init__ = checked_init
    return section


def _must(holds: Callable[[Any], Any], requirement: str) -> AfterValidator:
    """A check on one field; a failure reads "`path` <requirement>, got <value>"."""

    def check(value: Any) -> Any:
        if not holds(value):
            raise ValueError(requirement)
        return value

    return AfterValidator(check)


def _within(low: int, high: int) -> AfterValidator:
    return _must(lambda value: low <= value <= high, f"must be within [{low}, {high}]")


def _quantity(requirement: str) -> BeforeValidator:
    """A Kubernetes quantity ("2", "500m", "1e3", "1.5Gi"), as Kubernetes' own parser reads it.
    YAML numbers (`cpu_request: 2`) are kept as the text Kubernetes expects ("2")."""

    def parse(value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(int(value)) if float(value).is_integer() else str(value)
        try:
            amount = parse_quantity(value) if isinstance(value, str) else None
        except ValueError:
            amount = None
        if not (isinstance(amount, Decimal) and amount.is_finite() and amount >= 0):
            raise ValueError(requirement)
        return value

    return BeforeValidator(parse)


_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-")
_NAME_RULE = "must be a non-empty name of letters, digits, '_' or '-'"


def _is_name(value: str) -> bool:
    return bool(value) and set(value) <= _NAME_CHARS


def check_name(value: str, field_name: str) -> None:
    """Refuses `value` unless it is safe as a file name and a URL path segment."""
    if not _is_name(value):
        raise ConfigError(f"{_NAME_RULE}, got {value!r}", field=field_name)


# Field types shared by the sections; a refused value is reported with the requirement.
Name = Annotated[str, _must(_is_name, _NAME_RULE)]
Flag = Annotated[str, _must(lambda arg: arg.startswith("--"), "must look like --flag=value")]
Image = Annotated[
    str,
    _must(
        lambda image: image and not any(c.isspace() for c in image),
        "must be a container image reference",
    ),
]
NonBlank = Annotated[str, _must(str.strip, "must not be blank")]
Location = Annotated[
    str, Field(min_length=1, description="give a gs:// URI or a path on the volume")
]
Namespace = Annotated[
    str,
    _must(
        re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?").fullmatch,
        "must be a Kubernetes namespace name (lowercase letters, digits and '-')",
    ),
]
KubernetesName = Annotated[
    str,
    _must(
        re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?").fullmatch,
        "must be a Kubernetes object name (lowercase letters, digits, '-' and '.')",
    ),
]
CpuQuantity = Annotated[str, _quantity("must be a CPU quantity like '2', '0.5' or '500m'")]
MemoryQuantity = Annotated[str, _quantity("must be a memory quantity like '512Mi' or '16Gi'")]


@_section
class TextColumn:
    """A free-text column, tokenized by Transform into a fixed-length sequence of ids."""

    name: str
    tokenizer: Literal["word", "char"] = "word"  # "word" (whitespace), "char" (Unicode: CJK works)
    max_tokens: PositiveInt = 32
    vocab_size: PositiveInt = 5000
    lowercase: bool = True


@_section
class DataSpec:
    """What the data is: where it lives and what each column means."""

    path: str = BUNDLED_PENGUINS  # a CSV file or folder of CSVs, a TFRecord folder, a bundled name
    # tfrecord: gzip or plain tf.Example records; parquet: a file or a folder of .parquet files,
    # typed by their schema (fullthrottle/core/parquet.py)
    format: Literal["csv", "tfrecord", "parquet"] = "csv"
    label: Annotated[str, Field(min_length=1, description="name the label column")] = "species"
    # What the label is: "classification" (each distinct value is a class; the model answers
    # class probabilities) or "regression" (a number; the model answers a number, trained on the
    # squared error, and every present label cell must be a number).
    task: Literal["classification", "regression"] = "classification"
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
    # How numbers in `numeric` columns are written: "18,9" needs decimal ",", "1,234.5" needs
    # thousands ",". Applied when `run` stages a CSV (fullthrottle/core/data_checks.py).
    decimal: Literal[".", ","] = "."
    thousands: Literal[",", ".", " ", "'"] | None = None
    # Label values that differ only in whitespace or case ("Adelie", "Adelie "): "stop" the run
    # and say where they are, "merge" each group into its most frequent spelling (when `run`
    # stages a CSV), or "keep" them as different classes.
    near_duplicate_labels: Literal["stop", "merge", "keep"] = "stop"
    # The train : eval shares of the input rows, e.g. 3 : 1. CSV input is split stratified by
    # label when `run` stages it (every class keeps a row in train; fullthrottle/core/splits.py),
    # TFRecord input by ExampleGen's hash buckets.
    train_buckets: PositiveInt = 3
    eval_buckets: PositiveInt = 1
    # A schema.pbtxt to import instead of inferring one with SchemaGen.
    schema_path: str | None = None

    def __post_init__(self) -> None:
        if not self.feature_columns:
            raise ConfigError(
                "the data spec has no feature columns: list some under `data.numeric`, "
                "`data.categorical` or `data.text`"
            )
        if self.thousands == self.decimal:
            raise ConfigError(
                f"must differ from `decimal`, both are {self.decimal!r}", field="thousands"
            )
        seen: set[str] = set()
        for name in self.feature_columns:
            if name in seen:
                raise ConfigError(f"column {name!r} is listed twice in the data spec")
            if name == self.label:
                raise ConfigError(f"the label column {name!r} is also listed as a feature")
            seen.add(name)
        # Inside the model every column has a TensorFlow/Keras-safe name; no two may share one.
        check_internal_names(
            [
                (self.label, "data.label"),
                *((name, "data.numeric") for name in self.numeric),
                *((name, "data.categorical") for name in self.categorical),
                *((column.name, "data.text") for column in self.text),
            ]
        )

    @property
    def feature_columns(self) -> tuple[str, ...]:
        return (*self.numeric, *self.categorical, *(t.name for t in self.text))

    @property
    def all_columns(self) -> tuple[str, ...]:
        return (*self.feature_columns, self.label)


@_section
class BeamConfig:
    """Apache Beam options for the data components (ExampleGen, StatisticsGen, Transform, ...)."""

    # DirectRunner mode. "in_memory" is the default by measurement: on the bundled data the
    # whole pipeline took 17 s in memory and 47 s with multi_processing (worker start-up
    # dominates small data); multi_processing pays off on large inputs.
    direct_running_mode: Literal["in_memory", "multi_threading", "multi_processing"] = "in_memory"
    direct_num_workers: Annotated[NonNegativeInt, Field(description="0 = one per core")] = 0
    extra_args: tuple[Flag, ...] = ()  # passed verbatim, e.g. ("--runner=FlinkRunner", ...)


@_section
class TrackingConfig:
    """Where and how runs are tracked in MLflow (`tracking:` section; see docs/tracking.md).

    Tracking never stops training: a server that is down or slow is retried `retries` times
    (each request bounded by `request_timeout_seconds`), then the run is reported as having
    incomplete tracking in last_run.json and the CLI's exit message.
    """

    enabled: bool = True
    # None: $MLFLOW_TRACKING_URI if set, else SQLite + artifacts under <output_dir>/mlflow/.
    uri: NonBlank | None = None  # http://host:port, sqlite:///path
    experiment: NonBlank | None = None  # None: the pipeline name
    register_model: bool = True  # register blessed, pushed models under `model_name`
    registry_alias: Name = "champion"  # moved to the newest pushed version
    retries: NonNegativeInt = 3
    retry_backoff_seconds: NonNegativeFloat = 1.0  # doubled after each failed attempt
    request_timeout_seconds: PositiveInt = 15
    flush_timeout_seconds: PositiveFloat = 60.0  # how long the end of training waits for metrics
    system_metrics_interval_seconds: Annotated[
        NonNegativeFloat, Field(description="0 turns CPU/memory/GPU sampling off")
    ] = 5.0
    # Training metrics go to MLflow in one request at most this often (0: at every checkpoint).
    metrics_interval_seconds: NonNegativeFloat = 5.0
    # About this many points per training curve of the Trainer's run: consecutive loops are
    # aggregated into points of train_steps / points_per_curve steps (0: a point per loop).
    points_per_curve: NonNegativeInt = 100


@_section
class EvalConfig:
    """The Evaluator's blessing rule (`fullthrottle.core.evaluation.BlessingRule`): an absolute
    bar on the primary metric and, once a model of this pipeline was blessed, no worse than it."""

    # Classification: the candidate's eval accuracy must reach this (applied as written: 0.399
    # is 0.399).
    accuracy_threshold: Annotated[float, _within(0, 1)] = 0.8
    # Regression (`data.task: regression`): the candidate's eval mean absolute error must be at
    # most this, in the label's units. Required for regression (`init` sets it from the data).
    max_mae: NonNegativeFloat | None = None
    # "latest_blessed": compare with the newest model of this pipeline the Evaluator blessed
    # (TFX's LatestBlessedModelStrategy); the first run has none and is judged on the bar alone.
    # "none": the bar alone, always.
    baseline: Literal["latest_blessed", "none"] = "latest_blessed"
    # How much worse than that model the candidate may be on the primary metric (0: no worse).
    baseline_tolerance: NonNegativeFloat = 0.0


_VERSION_LABEL = re.compile(r"[A-Za-z0-9_-]{1,64}")


@_section
class ServingConfig:
    """How pushed models are stored, warmed up, served and deployed (`serving:` section).

    One section feeds the Pusher, `fullthrottle serve`, `fullthrottle predict` and the deploy kit,
    so names, ports and paths agree everywhere.
    """

    # PredictionLog records written to assets.extra/tf_serving_warmup_requests, in all (half per
    # signature: serving_default and predict_raw, alternating).
    warmup_requests: Annotated[
        int, _within(0, 1000), Field(description="TF Serving reads at most 1000")
    ] = 64
    # Newest K version folders kept after a push.
    keep_versions: Annotated[NonNegativeInt, Field(description="0 keeps all")] = 0
    serve_versions: PositiveInt = 1  # the server keeps the newest N loaded (TF Serving's latest)
    tflite: bool = False  # also write tflite/model_float32.tflite beside the pushed SavedModel
    tflite_quantize: bool = False  # and model_dynamic_range.tflite (int8 weights, float maths)
    host: Annotated[str, Field(min_length=1, description="127.0.0.1 serves this machine only")] = (
        "127.0.0.1"
    )
    rest_port: Annotated[int, _within(0, 65535), Field(description="a TCP port")] = 8501
    grpc_port: Annotated[int, _within(0, 65535), Field(description="a TCP port")] = 8500
    max_request_bytes: PositiveInt = 4 * 1024 * 1024  # larger REST bodies get a 413
    # gRPC requests and answers up to this size (RESOURCE_EXHAUSTED beyond): TF Serving's own
    # limit, 2 GiB - 1 (its server sets gRPC's max message size to INT32_MAX).
    grpc_max_message_bytes: Annotated[int, _within(1, 2**31 - 1)] = 2**31 - 1
    poll_seconds: PositiveFloat = 1.0  # how often `serve` looks for a new version folder
    # TF Serving batching (the deploy kit's batching.config); see serving/deploy/README section.
    max_batch_size: PositiveInt = 64
    batch_timeout_micros: PositiveInt = 2000
    num_batch_threads: PositiveInt = 2
    max_enqueued_batches: PositiveInt = 64
    # TF Serving must be at least as new as the TensorFlow that wrote the SavedModel (2.21 here):
    # an older runtime may lack ops or op attributes the model uses.
    image: str = "tensorflow/serving:2.21.0"
    # TF Serving's version labels (models.config `version_labels`, `/labels/<label>` routes):
    # label -> version folder. `serve` adds the MLflow alias (`tracking.registry_alias`) as a label.
    version_labels: Annotated[
        Mapping[str, PositiveInt],
        _must(
            lambda labels: all(_VERSION_LABEL.fullmatch(label) for label in labels),
            "must map labels of 1-64 letters, digits, '_' or '-' (a URL path segment) to versions",
        ),
    ] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rest_port and self.rest_port == self.grpc_port:
            raise ConfigError(
                f"must differ from `grpc_port`, both are {self.rest_port}", field="rest_port"
            )
        if self.tflite_quantize and not self.tflite:
            raise ConfigError("needs `tflite: true`", field="tflite_quantize")


# Beam runners whose job cannot start without these flags; checked before compiling.
BEAM_RUNNER_REQUIRED_ARGS: Mapping[str, tuple[str, ...]] = types.MappingProxyType(
    {
        "DataflowRunner": ("--project", "--region", "--temp_location"),
        "FlinkRunner": ("--flink_master",),
        "SparkRunner": ("--spark_master_url",),
        "PortableRunner": ("--job_endpoint",),
    }
)


@_section
class StepResources:
    """Container resources of one Kubeflow step. `None` inherits `kubeflow.resources.default`.

    CPU and memory take Kubernetes quantities ("500m", "2", "1e3", "512Mi", "1.5Gi"); the
    accelerator is a Kubernetes resource name ("nvidia.com/gpu") and a count (0 = none).
    """

    cpu_request: CpuQuantity | None = None
    cpu_limit: CpuQuantity | None = None
    memory_request: MemoryQuantity | None = None
    memory_limit: MemoryQuantity | None = None
    accelerator_type: NonBlank | None = None  # a Kubernetes resource name: "nvidia.com/gpu"
    accelerator_count: Annotated[NonNegativeInt | None, Field(description="0 = none")] = None

    def over(self, base: StepResources) -> StepResources:
        """These resources, with every unset field taken from `base`."""
        return StepResources(
            **{
                f.name: getattr(base, f.name)
                if getattr(self, f.name) is None
                else getattr(self, f.name)
                for f in dataclasses.fields(self)
            }
        )


# Built-in resources, beneath whatever `kubeflow.resources` sets: the Trainer on a GPU, the rest
# on CPU. A user's field wins over these field by field, so `trainer.accelerator_count: 2` keeps
# the Trainer's other built-in values.
DEFAULT_STEP_RESOURCES = StepResources(cpu_request="2", memory_request="4Gi", memory_limit="8Gi")
BUILTIN_STEP_RESOURCES: Mapping[str, StepResources] = types.MappingProxyType(
    {
        # No GPU unless asked (`--preset gpu`, `multi_gpu`, or `accelerator_count`): a CPU-only
        # cluster's first run must schedule. The type is there so that a count alone asks.
        "trainer": StepResources(
            cpu_request="4",
            memory_request="16Gi",
            memory_limit="32Gi",
            accelerator_type="nvidia.com/gpu",
            accelerator_count=0,
        )
    }
)


@_section
class PipelineResources:
    """Per-step resources (`kubeflow.resources`); see `for_step` for how they combine."""

    default: StepResources = field(default_factory=StepResources)
    example_gen: StepResources = field(default_factory=StepResources)
    statistics_gen: StepResources = field(default_factory=StepResources)
    schema_gen: StepResources = field(default_factory=StepResources)
    example_validator: StepResources = field(default_factory=StepResources)
    transform: StepResources = field(default_factory=StepResources)
    trainer: StepResources = field(default_factory=StepResources)
    evaluator: StepResources = field(default_factory=StepResources)
    pusher: StepResources = field(default_factory=StepResources)

    def for_step(self, step: str) -> StepResources:
        """Effective resources of `step` (a field name here, e.g. "trainer"), field by field:
        this step's setting, else the step's built-in, else `default`, else the built-in default."""
        builtin = BUILTIN_STEP_RESOURCES.get(step, StepResources())
        return getattr(self, step).over(builtin).over(self.default).over(DEFAULT_STEP_RESOURCES)


@_section
class TFJobConfig:
    """The Trainer as a Kubeflow Training Operator TFJob (`kubeflow.tfjob`).

    With `enabled`, the Trainer step creates a TFJob of `workers` replicas (one Chief plus
    `workers - 1` Workers) that all run the same trainer code; the operator sets TF_CONFIG and the
    training library picks MultiWorkerMirroredStrategy from it. The step waits for the job.
    """

    enabled: bool = False
    workers: Annotated[int, Field(ge=1, description="the chief counts as one")] = 2
    image: Image | None = None  # default: `kubeflow.image`
    # Per replica; unset fields come from `kubeflow.resources.trainer` (then `.default`).
    resources: StepResources = field(default_factory=StepResources)
    timeout_minutes: PositiveInt = 24 * 60
    poll_seconds: PositiveInt = 30
    clean_pod_policy: Literal["None", "Running", "All"] = "Running"  # "None" keeps finished pods
    service_account: str | None = None


@_section
class VolumeConfig:
    """The PersistentVolumeClaim every Kubeflow step and TFJob replica mounts (`kubeflow.volume`),
    where the default roots live. `claim_name: null` mounts none: then every root must be an
    object-store URI."""

    claim_name: KubernetesName | None = "fullthrottle"  # an existing PVC in the run's namespace
    mount_path: Annotated[
        str, _must(lambda path: path.startswith("/") and path != "/", "must be an absolute path")
    ] = "/mnt/fullthrottle"


@_section
class KubeflowConfig:
    """How `fullthrottle compile --target kubeflow` builds the KFP v2 spec (`kubeflow:` section).

    Paths are as the pods see them: an object store URI (gs://, s3://) or a volume mount path.
    """

    image: Image = "fullthrottle:0.1.0"  # the image built from the repo's Dockerfile, pushed
    # Image of the steps that request no accelerator (the Dockerfile's smaller `cpu` target);
    # None: they run `image` too. Steps with a GPU and TFJob replicas always run `image`.
    cpu_image: Image | None = None
    # A path under `volume.mount_path` (the PVC) or a gs:// URI (docs/kubeflow.md, object stores).
    volume: VolumeConfig = field(default_factory=VolumeConfig)
    pipeline_root: Location = "/mnt/fullthrottle/pipeline_root"  # the pipeline name is appended
    input_base: Location = "/mnt/fullthrottle/data"  # input files, staged as `run` stages them
    serving_dir: Location = "/mnt/fullthrottle/serving"  # the model name is appended
    # Beam args of the data components. In a pod: DirectRunner, one process per requested CPU
    # (not 0 = "all cores": in a pod that counts the node's cores, not the pod's share).
    # A distributed runner replaces them, e.g. ["--runner=FlinkRunner", "--flink_master=...", ...].
    beam_args: tuple[Flag, ...] = (
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
    )
    enable_cache: bool | None = None  # KFP step caching; None follows the top-level `enable_cache`
    namespace: Namespace = "kubeflow"  # of KFP runs and of TFJobs
    # Seconds a Trainer pod (the TFJob replicas) has between SIGTERM (preemption, eviction) and
    # SIGKILL: enough to finish the current loop and write a checkpoint (docs/kubeflow.md).
    termination_grace_period_seconds: PositiveInt = 300
    # Retries of the Trainer step (KFP) and of TFJob replicas killed from outside: each resumes
    # from the newest checkpoint.
    trainer_retries: NonNegativeInt = 3
    resources: PipelineResources = field(default_factory=PipelineResources)
    tfjob: TFJobConfig = field(default_factory=TFJobConfig)

    def __post_init__(self) -> None:
        for name in ("pipeline_root", "input_base", "serving_dir"):
            location = getattr(self, name)
            check_location(location, field=name)
            if scheme_of(location) is None and not location.startswith("/"):
                raise ConfigError(
                    f"{location!r} is relative; give a path the pods see (under "
                    f"`volume.mount_path`, {self.volume.mount_path}) or a gs:// URI",
                    field=name,
                )
        flags = {arg.split("=", 1)[0] for arg in self.beam_args}
        for arg in self.beam_args:
            if arg.startswith("--runner="):
                runner = arg.split("=", 1)[1]
                missing = [f for f in BEAM_RUNNER_REQUIRED_ARGS.get(runner, ()) if f not in flags]
                if missing:
                    raise ConfigError(
                        f"selects {runner} but lacks {', '.join(missing)}: add "
                        + ", ".join(f"{f}=..." for f in missing)
                        + " (see docs/scaling.md)",
                        field="beam_args",
                    )


@_section
class Config:
    """Everything one `fullthrottle run` needs."""

    pipeline_name: Name = "fullthrottle-penguins"
    model_name: Name = "penguins"
    output_dir: Annotated[str, Field(min_length=1)] = "runs"
    enable_cache: bool = True
    data: DataSpec = field(default_factory=DataSpec)
    # A stdlib dataclass of the training library: pydantic checks its field types and runs its
    # own validation (`__post_init__`), whose ConfigError names the field.
    training: TrainingConfig = field(default_factory=TrainingConfig)
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    beam: BeamConfig = field(default_factory=BeamConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)
    kubeflow: KubeflowConfig = field(default_factory=KubeflowConfig)

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

    def __post_init__(self) -> None:
        if self.data.task == "regression" and self.evaluation.max_mae is None:
            raise ConfigError(
                "`data.task` is regression, so the Evaluator needs a bar on the error: set "
                "`evaluation.max_mae` to the largest mean absolute error (in the label's units) a "
                "model may have and still be pushed (`fullthrottle init` sets it to the error of "
                "always answering the median)"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Named hardware presets derive from the default by overriding a few fields; they never copy it.
PRESETS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType(
    {
        "cpu": {"training": {"strategy": "one_device", "precision": "auto"}},
        "gpu": {
            "training": {"strategy": "one_device", "precision": "auto", "jit_compile": True},
            "kubeflow": {"resources": {"trainer": {"accelerator_count": 1}}},
        },
        "multi_gpu": {
            "training": {"strategy": "mirrored", "precision": "auto", "jit_compile": True},
            "kubeflow": {"resources": {"trainer": {"accelerator_count": 2}}},
        },
        "multi_worker": {"training": {"strategy": "multi_worker", "precision": "auto"}},
    }
)


# What a field must be, by pydantic's error type, when the value has the wrong type.
_EXPECTED = {
    **dict.fromkeys(("bool_type", "bool_parsing"), "true or false"),
    **dict.fromkeys(("int_type", "int_parsing", "int_from_float"), "an integer"),
    **dict.fromkeys(("float_type", "float_parsing"), "a number"),
    **dict.fromkeys(("tuple_type", "list_type"), "a list"),
    **dict.fromkeys(("dict_type", "dataclass_type"), "a mapping of fields"),
    "string_type": "a string",
    "none_required": "empty (null)",
}


def config_error(exc: ValidationError, root: type) -> ConfigError:
    """One `ConfigError` for what pydantic refused while building `root`, a sentence per field:
    "`training.per_replica_batch_size` must be > 0, got -4", "unknown config key
    `training.lerning_rate` (did you mean `learning_rate`?); known keys here: ..."."""
    by_path: dict[str, list[tuple[Any, type | None, str]]] = {}
    for error in exc.errors():
        path, owner, name = _locate(root, error["loc"])
        by_path.setdefault(path, []).append((error, owner, name))
    return ConfigError("; ".join(_sentence(path, errors) for path, errors in by_path.items()))


def _locate(root: type, loc: tuple[int | str, ...]) -> tuple[str, type | None, str]:
    """The dotted path of `loc` ("data.text[0].name"), the dataclass owning its last field, and
    that field's name. Stops at a union member's tag, which names a type, not a field."""
    path, owner, name, kind = "", None, "", root
    for part in loc:
        if isinstance(part, int):  # an entry of tuple[X, ...]
            path, kind = f"{path}[{part}]", next(iter(typing.get_args(kind)), None)
        elif typing.get_origin(kind) in (dict, Mapping):
            path, kind = f"{path}.{part}", typing.get_args(kind)[-1]
        elif dataclasses.is_dataclass(kind):
            owner, name = kind, str(part)
            path = f"{path}.{name}" if path else name
            kind = typing.get_type_hints(owner).get(name)
        else:
            break
    return path, owner, name


def _sentence(path: str, errors: list[tuple[Any, type | None, str]]) -> str:
    error, owner, name = errors[0]
    kind, context, value = error["type"], error.get("ctx") or {}, error["input"]
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        known = sorted(f.name for f in dataclasses.fields(owner)) if owner else []
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean `{close[0]}`?)" if close else ""
        return f"unknown config key `{path}`{hint}; known keys here: {', '.join(known)}"
    if kind == "missing":
        return f"`{path}` is required"
    cause = context.get("error")
    if isinstance(cause, ConfigError):  # from a `__post_init__`: a complete statement
        if cause.field:
            return cause.text(".".join(filter(None, (path, cause.field))))
        return f"in `{path}`: {cause}" if path else str(cause)
    # A union refuses the value once per member: "must be true or false or a string".
    expected = dict.fromkeys(_EXPECTED[e["type"]] for e, _, _ in errors if e["type"] in _EXPECTED)
    if expected:
        requirement = f"must be {' or '.join(expected)}"
        value = f"{type(value).__name__} {value!r}"
    else:
        requirement, value = _requirement(kind, context, error["msg"]), repr(value)
    info = getattr(owner, "__pydantic_fields__", {}).get(name)
    hint = f" ({info.description})" if info is not None and info.description else ""
    return f"`{path}` {requirement}{hint}, got {value}"


def _requirement(kind: str, context: dict[str, Any], pydantic_message: str) -> str:
    for key, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
        if key in context:
            bound = context[key]
            return f"must be {symbol} {int(bound) if float(bound).is_integer() else bound}"
    if kind == "literal_error":
        return f"must be {context['expected']}"
    if kind == "string_too_short":
        return "must not be empty"
    if kind in ("too_short", "too_long"):
        return f"must have {context.get('min_length', context.get('max_length'))} entries"
    if "error" in context:  # a field check (`_must`, `_quantity`): its requirement
        return str(context["error"])
    return f"is refused ({pydantic_message})"


_adapter = functools.cache(pydantic.TypeAdapter)


def _plain_json(value: Any) -> Any:
    """What `json.dumps` cannot write itself: sections built in code, and YAML's dates."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


@functools.cache
def _holder(cls: type, where: str) -> type:
    # A one-field section named `where`: paths start with it, and a stdlib dataclass held in it
    # (TrainingConfig) refuses unknown keys as the sections do.
    holder = type(f"{where}_section", (), {"__annotations__": {where: cls}})
    return pydantic.dataclasses.dataclass(holder, config={"extra": "forbid"})


def validate_section[T](cls: type[T], data: Any, *, where: str = "") -> T:
    """`cls` built from plain data (YAML, a component's JSON custom_config) and validated.

    Args:
        cls: a section of this module, or the training library's `TrainingConfig`.
        data: a mapping of fields; lists stand for tuples.
        where: the section's dotted path in the whole config ("training"), which error messages
            start with. Needed for a stdlib dataclass, whose unknown keys are refused only here.

    Raises:
        ConfigError: one message naming each refused field by its path (`config_error`).
    """
    root = _holder(cls, where) if where else cls
    # Validated as JSON in strict mode: a config is JSON-like data, and strict JSON refuses what
    # lax Python mode would coerce (`true` or "5" for an integer, 1 for a boolean) while still
    # reading lists as tuples and mappings as sections.
    document = json.dumps({where: data} if where else data, default=_plain_json)
    try:
        built = _adapter(root).validate_json(document, strict=True)
    except ValidationError as exc:
        raise config_error(exc, root) from None
    return getattr(built, where) if where else built


def data_spec_from_custom_config(custom_config: Mapping[str, Any] | None) -> DataSpec:
    """Rebuilds the validated `DataSpec` that the pipeline put into a component's custom_config."""
    if not custom_config or "data" not in custom_config:
        raise ValueError("custom_config must carry the `data` spec (set by pipelines.pipeline)")
    return validate_section(DataSpec, custom_config["data"], where="data")


def _deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


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
    overrides: Sequence[str] = (),
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
            raise ConfigError(
                missing_path_message(path, "config file", "; create one with `fullthrottle init`")
            )
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
                if (
                    isinstance(value, str)
                    and value
                    and not value.startswith("bundled:")
                    and value != BUNDLED_PENGUINS
                    and not Path(value).is_absolute()
                    and "://" not in value
                ):
                    data_section[key] = str((path.parent / value).resolve())
            loaded["data"] = data_section
        data = _deep_merge(data, loaded)
    for text in overrides:
        data = _deep_merge(data, parse_override(text))
    try:
        return validate_section(Config, data)
    except ConfigError as exc:
        if path is not None:
            raise ConfigError(f"{path}: {exc}") from None
        raise
