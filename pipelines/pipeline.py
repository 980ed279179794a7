"""The fullthrottle pipeline, wired in one pure function.

ExampleGen (CSV, Parquet: components/arrow_example_gen.py) -> StatisticsGen -> SchemaGen (or
an imported schema) -> ExampleValidator -> Transform -> Trainer -> Evaluator (against the latest
blessed model) -> Pusher (only when the Evaluator blesses the model).

No training, parsing or tracking logic lives here: Transform and Trainer reach the project's
code by dotted name (`trainer_module.transform.preprocessing_fn`, `trainer_module.run.run_fn`)
and get the validated config through `custom_config`. Runners (local, Kubeflow) choose paths and
call `create_pipeline`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow_model_analysis as tfma

# TFX's modules, not its `tfx.v1` facade: importing that loads Google Cloud's AI Platform SDK
# (its extensions), 2-3 s of every process that builds the pipeline.
from tfx.components import (
    Evaluator,
    ExampleValidator,
    ImportExampleGen,
    SchemaGen,
    StatisticsGen,
    Trainer,
    Transform,
)
from tfx.dsl.components.common.resolver import Resolver
from tfx.dsl.experimental.conditionals.conditional import Cond
from tfx.dsl.input_resolution.strategies.latest_blessed_model_strategy import (
    LatestBlessedModelStrategy,
)
from tfx.orchestration.pipeline import Pipeline
from tfx.proto import example_gen_pb2, trainer_pb2
from tfx.types import standard_artifacts
from tfx.types.channel import Channel

from components.arrow_example_gen import example_gen as arrow_example_gen
from components.data_gate import DataGate, ImportSchema, describe_inputs, file_digest
from components.safe_pusher import SafePusher
from fullthrottle.core.bundled import schema_path_for
from fullthrottle.core.config import Config
from fullthrottle.core.evaluation import (
    LATEST_BLESSED,
    PREDICTION_KEYS,
    REPORTED_METRICS,
    BlessingRule,
)
from fullthrottle.core.features import transformed_name
from fullthrottle.core.splits import SPLITS
from fullthrottle.tracking import LINK_KEY

PREPROCESSING_FN = "trainer_module.transform.preprocessing_fn"
RUN_FN = "trainer_module.run.run_fn"
# The code each component runs by dotted name. Dotted-name user code is not fingerprinted by
# TFX (a module_file would be), so without these an edited trainer would hit a stale cache; each
# component hashes only its own code, so editing the model server does not retrain.
TRANSFORM_CODE = ("trainer_module/transform.py", "fullthrottle/core/features.py")
# TrainingConfig fields that reach run_fn as fn_args.train_steps / eval_steps.
STEP_COUNTS = ("train_steps", "eval_steps")
TRAINER_CODE = ("trainer_module", "serving/signatures.py", "fullthrottle/core/features.py")
# The node that finds the latest blessed model for the Evaluator's comparison.
BASELINE_RESOLVER = "latest_blessed_model_resolver"


def code_fingerprint(paths: Sequence[str] = TRAINER_CODE) -> str:
    """Hash of the Python files under `paths` (files or packages, relative to the project)."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for entry in paths:
        target = root / entry
        files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
        for path in files:
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _runtime_path(path: str, project_root: str | None) -> str:
    """`path` as the running pipeline sees it: files inside this project move with it."""
    here = Path(__file__).resolve().parent.parent
    if project_root and "://" not in path:
        try:
            return str(Path(project_root) / Path(path).resolve().relative_to(here))
        except ValueError:
            return path
    return path


def _plain(value: Any) -> Any:
    """custom_config must be JSON: tuples become lists."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def eval_config(config: Config, *, with_baseline: bool = True) -> tfma.EvalConfig:
    """TFMA's EvalConfig for the config's blessing rule (`with_baseline`: False leaves the
    comparison with the latest blessed model out)."""
    rule = BlessingRule.from_config(config)
    if not with_baseline:
        rule = dataclasses.replace(rule, baseline_tolerance=None)
    return tfma_eval_config(
        rule,
        label_key=transformed_name(config.data.label),
        prediction_key=PREDICTION_KEYS[rule.task],
        reported=REPORTED_METRICS[rule.task],
    )


def _as_reported(value: float) -> float:
    """`value` in the precision TFMA reports metrics in (float32, as Keras computes them), so a
    bound is applied as written: an accuracy of exactly 0.399 meets a bound of 0.399, although
    float32(0.399) < 0.399 in double precision."""
    return float(np.float32(value))


def tfma_eval_config(
    rule: BlessingRule,
    *,
    label_key: str,
    prediction_key: str = "probabilities",
    reported: tuple[str, ...] = ("SparseCategoricalCrossentropy",),
) -> tfma.EvalConfig:
    """The one place a blessing rule becomes TFMA's EvalConfig: the primary metric with its
    absolute bound (lower when higher is better, upper when lower is better) and, when the rule
    compares with a baseline, TFMA's change threshold in the metric's direction. TFX's Evaluator
    applies the change threshold only when it is given a baseline model (its rubber stamp: the
    first blessed model of a pipeline is judged on the bound alone). `reported` metrics are
    computed and shown, never judged."""
    metric = rule.metric
    bound = {"value": _as_reported(rule.bound)}
    value_threshold = (
        tfma.GenericValueThreshold(lower_bound=bound)
        if metric.higher_is_better
        else tfma.GenericValueThreshold(upper_bound=bound)
    )
    threshold = tfma.MetricThreshold(value_threshold=value_threshold)
    if rule.worst_change is not None:
        threshold.change_threshold.CopyFrom(
            tfma.GenericChangeThreshold(
                direction=tfma.MetricDirection.HIGHER_IS_BETTER
                if metric.higher_is_better
                else tfma.MetricDirection.LOWER_IS_BETTER,
                absolute={"value": rule.worst_change},
            )
        )
    return tfma.EvalConfig(
        model_specs=[
            tfma.ModelSpec(
                signature_name="serving_default",
                label_key=label_key,
                prediction_key=prediction_key,
                preprocessing_function_names=["transform_features"],
            )
        ],
        slicing_specs=[tfma.SlicingSpec()],
        metrics_specs=[
            tfma.MetricsSpec(
                metrics=[
                    tfma.MetricConfig(class_name="ExampleCount"),
                    tfma.MetricConfig(class_name=metric.tfma_class, threshold=threshold),
                    *(tfma.MetricConfig(class_name=name) for name in reported),
                ]
            )
        ],
    )


def create_pipeline(
    config: Config,
    *,
    input_base: str,
    pipeline_root: str,
    serving_dir: str,
    metadata_connection_config: Any | None = None,
    beam_pipeline_args: Sequence[str] = (),
    trainer_factory: Any | None = None,
    project_root: str | None = None,
    trainer_tracking: Mapping[str, Any] | None = None,
    resolve_baseline: bool = True,
) -> Pipeline:
    """Builds the whole pipeline from a validated config; reads nothing, runs nothing.

    The Evaluator compares the candidate with the latest blessed model of this pipeline (TFX's
    `Resolver` with `LatestBlessedModelStrategy`, as TFX's own templates wire it) unless
    `evaluation.baseline` is "none" or `resolve_baseline` is False (for orchestrators that
    cannot run a resolver node).

    `trainer_tracking` is the Trainer's MLflow link (`fullthrottle.tracking`: destination,
    experiment, pipeline key; the same on every run, so the Trainer's cache key holds), put into
    its custom_config; None: the Trainer does not track.

    `project_root` is where this project's files are when the pipeline runs, when that is not
    here (a container image's copy, for Kubeflow): paths of files it ships, such as the curated
    schema, are rewritten under it.

    `trainer_factory` takes `Trainer`'s arguments and returns the Trainer node
    (same inputs and outputs), so a runner can swap how training executes, not the wiring.
    """
    spec = config.data
    if spec.format == "tfrecord":
        # Split by hash buckets; staging has checked that every class keeps a record in train.
        example_gen = ImportExampleGen(
            input_base=input_base,
            output_config=example_gen_pb2.Output(
                split_config=example_gen_pb2.SplitConfig(
                    splits=[
                        example_gen_pb2.SplitConfig.Split(
                            name="train", hash_buckets=spec.train_buckets
                        ),
                        example_gen_pb2.SplitConfig.Split(
                            name="eval", hash_buckets=spec.eval_buckets
                        ),
                    ]
                )
            ),
        )
    else:
        # Staging wrote the splits, stratified by label: <input_base>/train/, <input_base>/eval/
        # (CSV, or Parquet typed by its schema). Read in Arrow record batches and encoded in bulk:
        # for CSV the examples TFX's CsvExampleGen writes, several times faster
        # (components/arrow_example_gen.py).
        example_gen = arrow_example_gen(
            input_base=input_base,
            input_config=example_gen_pb2.Input(
                splits=[
                    example_gen_pb2.Input.Split(name=name, pattern=f"{name}/*") for name in SPLITS
                ]
            ),
        )

    statistics_gen = StatisticsGen(examples=example_gen.outputs["examples"])
    schema_path = schema_path_for(spec)
    if schema_path:
        # Not ImportSchemaGen: its cache key is the path only, so an edited schema went unseen.
        schema_gen = ImportSchema(
            schema_file=_runtime_path(schema_path, project_root),
            schema_digest=file_digest(schema_path),
        )
    else:
        schema_gen = SchemaGen(
            statistics=statistics_gen.outputs["statistics"], infer_feature_shape=True
        )
    example_validator = ExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"]
    )
    # Anomalies stop the run here. Transform and Trainer read the gate's validated schema, so
    # they depend on the gate through data, not through a task edge.
    data_config = _plain(dataclasses.asdict(spec))
    data_gate = DataGate(
        anomalies=example_validator.outputs["anomalies"],
        schema=schema_gen.outputs["schema"],
        input_files=describe_inputs(spec, input_base),
        schema_source=_runtime_path(schema_path, project_root)
        if schema_path
        else "inferred by SchemaGen from this data",
        # The gate re-reads what ExampleGen read, for its cell checks.
        input_base=input_base,
        data_spec=json.dumps(data_config, sort_keys=True),
    )
    validated_schema = data_gate.outputs["validated_schema"]

    fingerprint = code_fingerprint(TRAINER_CODE)
    transform = Transform(
        examples=example_gen.outputs["examples"],
        schema=validated_schema,
        preprocessing_fn=PREPROCESSING_FN,
        # Nothing reads Transform's pre/post-transform statistics (StatisticsGen describes the raw
        # data) and the analyzer cache pays off only across spans: both off, 25 s -> 16 s on the
        # bundled data (docs/architecture.md).
        disable_statistics=True,
        disable_analyzer_cache=True,
        custom_config={"data": data_config, "code_fingerprint": code_fingerprint(TRANSFORM_CODE)},
    )
    trainer = (trainer_factory or Trainer)(
        run_fn=RUN_FN,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        schema=validated_schema,
        # Step counts travel in TFX's own train/eval args (what the Kubeflow UI shows), the rest
        # of the training config in custom_config: each value by one channel.
        train_args=trainer_pb2.TrainArgs(num_steps=config.training.train_steps),
        eval_args=trainer_pb2.EvalArgs(num_steps=config.training.eval_steps or 0),
        custom_config={
            "data": data_config,
            "training": {
                key: value
                for key, value in _plain(dataclasses.asdict(config.training)).items()
                if key not in STEP_COUNTS
            },
            "code_fingerprint": fingerprint,
            **({LINK_KEY: dict(trainer_tracking)} if trainer_tracking else {}),
        },
    )
    compare = resolve_baseline and config.evaluation.baseline == LATEST_BLESSED
    baseline_resolver = (
        Resolver(
            strategy_class=LatestBlessedModelStrategy,
            model=Channel(type=standard_artifacts.Model),
            model_blessing=Channel(type=standard_artifacts.ModelBlessing),
        ).with_id(BASELINE_RESOLVER)
        if compare
        else None
    )
    evaluator = Evaluator(
        examples=example_gen.outputs["examples"],
        model=trainer.outputs["model"],
        baseline_model=baseline_resolver.outputs["model"] if baseline_resolver else None,
        eval_config=eval_config(config, with_baseline=compare),
    )
    # SafePusher publishes complete version folders with warmup records, only when blessed.
    with Cond(evaluator.outputs["blessing"].future()[0].custom_property("blessed") == 1):
        pusher = SafePusher(
            model=trainer.outputs["model"],
            model_blessing=evaluator.outputs["blessing"],
            examples=example_gen.outputs["examples"],
            serving_dir=serving_dir,
            model_name=config.model_name,
            label=config.data.label,
            serving=config.serving,
        ).with_id("Pusher")

    return Pipeline(
        pipeline_name=config.pipeline_name,
        pipeline_root=pipeline_root,
        components=[
            example_gen,
            statistics_gen,
            schema_gen,
            example_validator,
            data_gate,
            transform,
            trainer,
            *([baseline_resolver] if baseline_resolver else []),
            evaluator,
            pusher,
        ],
        enable_cache=config.enable_cache,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=list(beam_pipeline_args),
    )
