"""The one frozen, validated configuration of a fullthrottle run.

Built once at the edge (CLI flags, a YAML file, presets) and passed down. Every dataclass
validates itself in `__post_init__` and names the bad field; `load_config` additionally rejects
unknown keys and wrong types with the dotted path of the field (``training.per_replica_batch_size``).
Data-dependent checks (does the column exist in the CSV?) live in `fullthrottle.core.staging`, and run
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

from fullthrottle.core.errors import ConfigError, TrainingConfigError
from trainer_module.training.config import TrainingConfig

BUNDLED_PENGUINS = "palmerpenguins"
BUNDLED_TEXT = "bundled:text_topics"

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def check_name(value: str, field_name: str) -> None:
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

    path: str = (
        BUNDLED_PENGUINS  # a CSV file or folder of CSVs, a TFRecord folder, or a bundled name
    )
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
            raise ConfigError(
                f"`beam.direct_num_workers` must be >= 0, got {self.direct_num_workers}"
            )
        for arg in self.extra_args:
            if not arg.startswith("--"):
                raise ConfigError(
                    f"`beam.extra_args` entries must look like --flag=value, got {arg!r}"
                )


# --- tracking (issue 5) --------------------------------------------------------------------
@dataclass(frozen=True)
class TrackingConfig:
    """Where and how runs are tracked in MLflow (`tracking:` section; see docs/tracking.md).

    Tracking never stops training: a server that is down or slow is retried `retries` times
    (each request bounded by `request_timeout_seconds`), then the run is reported as having
    incomplete tracking in last_run.json and the CLI's exit message.
    """

    enabled: bool = True
    # None: $MLFLOW_TRACKING_URI if set, else SQLite + artifacts under <output_dir>/mlflow/.
    uri: str | None = None
    experiment: str | None = None  # None: the pipeline name
    register_model: bool = True  # register blessed, pushed models under `model_name`
    registry_alias: str = "champion"  # moved to the newest pushed version
    retries: int = 3
    retry_backoff_seconds: float = 1.0  # doubled after each failed attempt
    request_timeout_seconds: int = 15
    flush_timeout_seconds: float = 60.0  # how long the end of training waits for queued metrics
    system_metrics_interval_seconds: float = 5.0  # CPU/memory/GPU sampling; 0 turns it off
    # Training metrics go to MLflow in one request at most this often (0: at every checkpoint).
    metrics_interval_seconds: float = 5.0
    # One point per metric per this much training time: shorter loops are aggregated into one
    # point (0: a point per loop). See docs/tracking.md.
    metrics_resolution_seconds: float = 1.0

    def __post_init__(self) -> None:
        if self.uri is not None and not self.uri.strip():
            raise ConfigError(
                "`tracking.uri` must be a URI (http://host:port, sqlite:///path) or null"
            )
        if self.experiment is not None and not self.experiment.strip():
            raise ConfigError(
                "`tracking.experiment` must be a non-empty name or null (= pipeline name)"
            )
        check_name(self.registry_alias, "tracking.registry_alias")
        if self.retries < 0:
            raise ConfigError(f"`tracking.retries` must be >= 0, got {self.retries}")
        for name in (
            "retry_backoff_seconds",
            "system_metrics_interval_seconds",
            "metrics_interval_seconds",
            "metrics_resolution_seconds",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"`tracking.{name}` must be >= 0, got {getattr(self, name)}")
        for name in ("request_timeout_seconds", "flush_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"`tracking.{name}` must be > 0, got {getattr(self, name)}")


# --- end tracking (issue 5) ----------------------------------------------------------------


@dataclass(frozen=True)
class EvalConfig:
    """The Evaluator's blessing rule."""

    accuracy_threshold: float = 0.8

    def __post_init__(self) -> None:
        if not 0.0 <= self.accuracy_threshold <= 1.0:
            raise ConfigError(
                f"`evaluation.accuracy_threshold` must be within [0, 1], got {self.accuracy_threshold}"
            )


# --- serving (issue 6) ---------------------------------------------------------------------
@dataclass(frozen=True)
class ServingConfig:
    """How pushed models are stored, warmed up, served and deployed (`serving:` section).

    One section feeds the Pusher, `fullthrottle serve`, `fullthrottle predict` and the deploy kit,
    so names, ports and paths agree everywhere.
    """

    # PredictionLog records written to assets.extra/tf_serving_warmup_requests per signature;
    # TF Serving reads at most 1000 of them.
    warmup_requests: int = 64
    keep_versions: int = 0  # newest K version folders kept after a push; 0 keeps all
    serve_versions: int = (
        1  # the server keeps the newest N versions loaded (TF Serving's latest policy)
    )
    tflite: bool = False  # also write model.tflite (float32) beside the pushed SavedModel
    tflite_quantize: bool = (
        False  # and model_dynamic_range.tflite (int8 weights, float activations)
    )
    host: str = "127.0.0.1"
    rest_port: int = 8501  # TF Serving's REST port
    grpc_port: int = 8500  # TF Serving's gRPC port
    max_request_bytes: int = 4 * 1024 * 1024  # larger request bodies get a 413
    poll_seconds: float = 1.0  # how often `serve` looks for a new version folder
    # TF Serving batching (the deploy kit's batching.config); see serving/deploy/README section.
    max_batch_size: int = 64
    batch_timeout_micros: int = 2000
    num_batch_threads: int = 2
    max_enqueued_batches: int = 64
    image: str = "tensorflow/serving:2.18.0"

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_requests <= 1000:
            raise ConfigError(
                f"`serving.warmup_requests` must be within [0, 1000] (TF Serving reads at most 1000), "
                f"got {self.warmup_requests}"
            )
        for name in ("keep_versions",):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"`serving.{name}` must be >= 0 (0 keeps all), got {getattr(self, name)}"
                )
        for name in (
            "serve_versions",
            "max_request_bytes",
            "max_batch_size",
            "batch_timeout_micros",
            "num_batch_threads",
            "max_enqueued_batches",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"`serving.{name}` must be > 0, got {getattr(self, name)}")
        for name in ("rest_port", "grpc_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(
                    f"`serving.{name}` must be a TCP port within [0, 65535], got {getattr(self, name)}"
                )
        if self.rest_port and self.rest_port == self.grpc_port:
            raise ConfigError(
                f"`serving.rest_port` and `serving.grpc_port` must differ, both are {self.rest_port}"
            )
        if self.poll_seconds <= 0:
            raise ConfigError(f"`serving.poll_seconds` must be > 0, got {self.poll_seconds}")
        if self.tflite_quantize and not self.tflite:
            raise ConfigError("`serving.tflite_quantize` needs `serving.tflite: true`")
        if not self.host:
            raise ConfigError(
                "`serving.host` must not be empty (127.0.0.1 serves this machine only)"
            )


# --- end serving (issue 6) -----------------------------------------------------------------


# --- kubeflow (issue 7) --------------------------------------------------------------------
_CPU_QUANTITY = re.compile(r"^(\d+(\.\d+)?|\d+m)$")  # "2", "0.5", "500m" (Kubernetes CPU units)
_MEMORY_QUANTITY = re.compile(r"^\d+(\.\d+)?(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$")  # "512Mi", "16Gi"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# Beam runners whose job cannot start without these flags; checked before compiling.
BEAM_RUNNER_REQUIRED_ARGS: Mapping[str, tuple[str, ...]] = types.MappingProxyType(
    {
        "DataflowRunner": ("--project", "--region", "--temp_location"),
        "FlinkRunner": ("--flink_master",),
        "SparkRunner": ("--spark_master_url",),
        "PortableRunner": ("--job_endpoint",),
    }
)


@dataclass(frozen=True)
class StepResources:
    """Container resources of one Kubeflow step. `None` inherits `kubeflow.resources.default`.

    CPU and memory take Kubernetes quantities ("500m", "2", "512Mi", "16Gi"); the accelerator is
    a Kubernetes resource name ("nvidia.com/gpu") and a count (0 = none).
    """

    # Numbers are accepted too (YAML reads `cpu_request: 2` as an int) and kept as strings.
    cpu_request: str | float | None = None
    cpu_limit: str | float | None = None
    memory_request: str | float | None = None
    memory_limit: str | float | None = None
    accelerator_type: str | None = None
    accelerator_count: int | None = None

    def __post_init__(self) -> None:
        for name in ("cpu_request", "cpu_limit", "memory_request", "memory_limit"):
            value = getattr(self, name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                text = str(int(value)) if float(value).is_integer() else str(value)
                object.__setattr__(self, name, text)
        for name in ("cpu_request", "cpu_limit"):
            value = getattr(self, name)
            if value is not None and not _CPU_QUANTITY.match(value):
                raise ConfigError(
                    f"`{name}` must be a CPU quantity like '2', '0.5' or '500m', got {value!r}"
                )
        for name in ("memory_request", "memory_limit"):
            value = getattr(self, name)
            if value is not None and not _MEMORY_QUANTITY.match(value):
                raise ConfigError(
                    f"`{name}` must be a memory quantity like '512Mi' or '16Gi', got {value!r}"
                )
        if self.accelerator_count is not None and self.accelerator_count < 0:
            raise ConfigError(
                f"`accelerator_count` must be >= 0 (0 = no accelerator), got {self.accelerator_count}"
            )
        if self.accelerator_type is not None and not self.accelerator_type.strip():
            raise ConfigError(
                "`accelerator_type` must name a resource like 'nvidia.com/gpu', got ''"
            )

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
        "trainer": StepResources(
            cpu_request="4",
            memory_request="16Gi",
            memory_limit="32Gi",
            accelerator_type="nvidia.com/gpu",
            accelerator_count=1,
        )
    }
)


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class TFJobConfig:
    """The Trainer as a Kubeflow Training Operator TFJob (`kubeflow.tfjob`).

    With `enabled`, the Trainer step creates a TFJob of `workers` replicas (one Chief plus
    `workers - 1` Workers) that all run the same trainer code; the operator sets TF_CONFIG and the
    training library picks MultiWorkerMirroredStrategy from it. The step waits for the job.
    """

    enabled: bool = False
    workers: int = 2  # replicas in total, chief included
    image: str | None = None  # default: `kubeflow.image`
    # Per replica; unset fields come from `kubeflow.resources.trainer` (then `.default`).
    resources: StepResources = field(default_factory=StepResources)
    timeout_minutes: int = 24 * 60
    poll_seconds: int = 30
    clean_pod_policy: str = "Running"  # "None" keeps finished pods (and their logs)
    service_account: str | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(
                f"`workers` must be >= 1 (the chief counts as one), got {self.workers}"
            )
        if self.timeout_minutes <= 0:
            raise ConfigError(f"`timeout_minutes` must be > 0, got {self.timeout_minutes}")
        if self.poll_seconds <= 0:
            raise ConfigError(f"`poll_seconds` must be > 0, got {self.poll_seconds}")
        if self.clean_pod_policy not in ("None", "Running", "All"):
            raise ConfigError(
                f"`clean_pod_policy` must be 'None', 'Running' or 'All', got {self.clean_pod_policy!r}"
            )
        if self.image is not None and (not self.image or any(c.isspace() for c in self.image)):
            raise ConfigError(f"`image` must be a container image reference, got {self.image!r}")


@dataclass(frozen=True)
class KubeflowConfig:
    """How `fullthrottle compile --target kubeflow` builds the KFP v2 spec (`kubeflow:` section).

    Paths are as the pods see them: an object store URI (gs://, s3://) or a volume mount path.
    """

    image: str = (
        "fullthrottle:0.1.0"  # the image built from the repo's Dockerfile, pushed somewhere
    )
    # Image of the steps that request no accelerator (the Dockerfile's smaller `cpu` target);
    # None: they run `image` too. Steps with a GPU and TFJob replicas always run `image`.
    cpu_image: str | None = None
    pipeline_root: str = "/mnt/fullthrottle/pipeline_root"  # the pipeline name is appended
    input_base: str = "/mnt/fullthrottle/data"  # folder of input files, staged as `run` stages them
    serving_dir: str = "/mnt/fullthrottle/serving"  # the model name is appended
    # Beam args of the data components. In a pod: DirectRunner, one process per requested CPU
    # (not 0 = "all cores": in a pod that counts the node's cores, not the pod's share).
    # A distributed runner replaces them, e.g. ["--runner=FlinkRunner", "--flink_master=...", ...].
    beam_args: tuple[str, ...] = (
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
    )
    enable_cache: bool | None = None  # KFP step caching; None follows the top-level `enable_cache`
    namespace: str = "kubeflow"  # of KFP runs and of TFJobs
    resources: PipelineResources = field(default_factory=PipelineResources)
    tfjob: TFJobConfig = field(default_factory=TFJobConfig)

    def __post_init__(self) -> None:
        if not self.image or any(c.isspace() for c in self.image):
            raise ConfigError(f"`image` must be a container image reference, got {self.image!r}")
        if self.cpu_image is not None and (
            not self.cpu_image or any(c.isspace() for c in self.cpu_image)
        ):
            raise ConfigError(
                f"`cpu_image` must be a container image reference, got {self.cpu_image!r}"
            )
        for name in ("pipeline_root", "input_base", "serving_dir"):
            if not getattr(self, name):
                raise ConfigError(
                    f"`{name}` must not be empty: give a gs://, s3:// URI or a volume path"
                )
        if not _DNS_LABEL.match(self.namespace):
            raise ConfigError(
                f"`namespace` must be a Kubernetes namespace name, got {self.namespace!r}"
            )
        flags = {arg.split("=", 1)[0] for arg in self.beam_args}
        for arg in self.beam_args:
            if not arg.startswith("--"):
                raise ConfigError(f"`beam_args` entries must look like --flag=value, got {arg!r}")
            if arg.startswith("--runner="):
                runner = arg.split("=", 1)[1]
                missing = [f for f in BEAM_RUNNER_REQUIRED_ARGS.get(runner, ()) if f not in flags]
                if missing:
                    raise ConfigError(
                        f"`beam_args` selects {runner} but lacks {', '.join(missing)}: add "
                        + ", ".join(f"{f}=..." for f in missing)
                        + " (see docs/scaling.md)"
                    )


# --- end kubeflow (issue 7) ----------------------------------------------------------------


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
    tracking: TrackingConfig = field(default_factory=TrackingConfig)  # issue 5
    beam: BeamConfig = field(default_factory=BeamConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)  # issue 6
    kubeflow: KubeflowConfig = field(default_factory=KubeflowConfig)  # issue 7

    def __post_init__(self) -> None:
        check_name(self.pipeline_name, "pipeline_name")
        check_name(self.model_name, "model_name")
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
        "multi_gpu": {
            "training": {"strategy": "mirrored", "precision": "auto", "jit_compile": True}
        },
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
        return tuple(
            _convert(v, a, f"{where}[{i}]")
            for i, (v, a) in enumerate(zip(args, value, strict=True))
        )
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
            raise ConfigError(
                f"config file {path} does not exist; create one with `fullthrottle init`"
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
                ):
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
