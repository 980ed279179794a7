"""The data the benchmarks train on and the pipelines they run.

Owns: generating CSV data of a given size (penguins-like tabular rows; the bundled text data for
the Transformer), running the real pipeline — whole, or its prefix up to Transform — on it, and
reading back from ML Metadata what the Trainer benchmarks need (transformed files, feature spec,
schema, ``ModelInputs``). Nothing here times anything.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullthrottle.core.config import BeamConfig, Config, DataSpec, TextColumn, load_config
from fullthrottle.core.paths import user_cache_dir
from trainer_module.training import ModelInputs, TrainingConfig

# The Transformer benchmark's shape: BERT-mini's width (d_model 256, 4 heads, FFN 1024; Turc et
# al. 2019) with 2 of its 4 layers (quick runs on 2 cores), sequence 128, batch 64, dropout 0.1,
# on the bundled text data; the same model for both contenders. A realistic small-BERT width
# gives matmuls large enough for oneDNN to run near the machine's ceiling; at d_model 128 /
# FFN 512 the step was dominated by element-wise ops (dropout RNG, GELU, casts), which no
# trainer can fix and which says little about real models.
# The data is Transform-ed as the project's own config for it does (configs/text_topics.yaml:
# 48 character tokens for texts of median 31 characters), so trimming is credited for the
# padding real data has, not for padding the benchmark added. The model reads with
# `cache: false` (the streaming reader), as text too large for the cache is read.
TRANSFORMER_DATA = DataSpec(
    path="bundled:text_topics",
    label="topic",
    numeric=("length_hint",),
    categorical=("language",),
    text=(TextColumn(name="message", tokenizer="char", max_tokens=48, vocab_size=400),),
    na_values=(),
)
TRANSFORMER_TRAINING = TrainingConfig(
    model="transformer",
    per_replica_batch_size=64,
    cache=False,
    models={"transformer": {"layers": 2, "d_model": 256, "heads": 4, "ffn_dim": 1024}},
)
# The tabular benchmark: the defaults, i.e. what `make run` trains on the penguins data.
TABULAR_TRAINING = TrainingConfig(model="tabular")


@dataclass(frozen=True)
class TrainingData:
    """Transform's output for one dataset, as both trainers read it."""

    name: str
    train_files: tuple[str, ...]
    examples_uri: str  # the transformed Examples artifact (for TFX's data accessor)
    feature_spec: dict[str, Any]
    schema: Any  # tensorflow_metadata Schema of the transformed features
    model_inputs: ModelInputs
    compression: str = "GZIP"


def _component(outcome: Any, name: str) -> Any:
    comp = outcome.components.get(name) if outcome else None
    if comp is None or comp.state not in ("complete", "cached"):
        raise RuntimeError(f"{name} did not complete in the benchmark's pipeline run")
    return comp


def training_data_from_run(mlmd_path: str, spec: DataSpec, *, name: str) -> TrainingData:
    """The newest run's Transform outputs in ``mlmd_path`` (the way the Trainer receives them)."""
    import tensorflow_transform as tft

    from fullthrottle.outcome import read_latest_run
    from trainer_module.run import model_inputs_from

    transform = _component(read_latest_run(mlmd_path), "Transform")
    graph_uri = transform.outputs["transform_graph"][0]["uri"]
    examples_uri = transform.outputs["transformed_examples"][0]["uri"]
    files = tuple(sorted(glob.glob(os.path.join(examples_uri, "Split-train", "*"))))
    if not files:
        raise RuntimeError(f"no transformed training files under {examples_uri}")
    tft_output = tft.TFTransformOutput(graph_uri)
    return TrainingData(
        name=name,
        train_files=files,
        examples_uri=examples_uri,
        feature_spec=dict(tft_output.transformed_feature_spec()),
        schema=tft_output.transformed_metadata.schema,
        model_inputs=model_inputs_from(spec, tft_output, list(files)),
    )


def write_tabular_csv(path: Path, rows: int, *, seed: int = 0) -> Path:
    """Penguins-shaped rows (4 numeric, 2 categorical, 3 classes) whose label depends on the
    features, so Transform and the Trainer do their ordinary work."""
    rng = random.Random(seed)
    species = ("Adelie", "Chinstrap", "Gentoo")
    islands = ("Biscoe", "Dream", "Torgersen")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(
            [
                "species",
                "island",
                "bill_length_mm",
                "bill_depth_mm",
                "flipper_length_mm",
                "body_mass_g",
                "sex",
            ]
        )
        for _ in range(rows):
            k = rng.randrange(3)
            writer.writerow(
                [
                    species[k],
                    islands[(k + rng.randrange(2)) % 3],
                    round(rng.gauss(39 + 7 * k, 3), 1),
                    round(rng.gauss(18.5 - 2 * (k == 2), 1.2), 1),
                    rng.randint(180, 200) + 20 * (k == 2),
                    rng.randint(3000, 4000) + 1200 * (k == 2),
                    rng.choice(("male", "female")),
                ]
            )
    return path


def streaming_cache_dir() -> Path:
    """Where generated streaming data is kept between benchmark runs (it takes minutes)."""
    return user_cache_dir() / "bench-streaming"


def streaming_tabular_data(
    like: TrainingData, *, rows: int, files: int, directory: Path | None = None, seed: int = 0
) -> TrainingData:
    """``rows`` random rows with ``like``'s transformed features (numeric: normal floats;
    categorical: ids below their cardinality; label: a class), as gzip TFRecords in ``files``
    files: data for the streaming reader, made once per shape in ``directory`` (default
    :func:`streaming_cache_dir`) and reused. Every value is drawn, so gzip compresses it like
    real data (repeating a small split would shrink the files below the cache line)."""
    import numpy as np
    import tensorflow as tf

    inputs = like.model_inputs
    numeric, categorical = list(inputs.numeric), dict(inputs.categorical)
    key = f"tabular-{rows}-{files}-{seed}-" + "-".join(numeric + sorted(categorical))
    folder = (directory or streaming_cache_dir()) / key
    split = folder / "Split-train"
    paths = [str(split / f"part-{i:05d}.gz") for i in range(files)]
    if not (folder / "complete").exists():
        split.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(seed)
        # One Example mutated in place per row: ~3x faster than building one per row.
        example = tf.train.Example()
        fields = {}
        for name in numeric:
            fields[name] = example.features.feature[name].float_list.value
            fields[name].append(0.0)
        for name in [*categorical, inputs.label]:
            fields[name] = example.features.feature[name].int64_list.value
            fields[name].append(0)
        per_file = -(-rows // files)
        for index, path in enumerate(paths):
            n = min(per_file, rows - index * per_file)
            floats = rng.normal(size=(n, len(numeric))).astype(np.float32).tolist()
            ints = {c: rng.integers(0, size, n).tolist() for c, size in categorical.items()}
            labels = rng.integers(0, inputs.num_classes, n).tolist()
            with tf.io.TFRecordWriter(path, options="GZIP") as writer:
                for row in range(n):
                    for column, name in enumerate(numeric):
                        fields[name][0] = floats[row][column]
                    for name, values in ints.items():
                        fields[name][0] = values[row]
                    fields[inputs.label][0] = labels[row]
                    writer.write(example.SerializeToString())
        (folder / "complete").write_text(f"{rows}\n", encoding="utf-8")
    return dataclasses.replace(
        like, name=f"{like.name}-streaming", train_files=tuple(paths), examples_uri=str(folder)
    )


def repeated_training_data(
    like: TrainingData, *, min_rows: int, files: int, directory: Path
) -> tuple[TrainingData, int, int]:
    """``like``'s training records repeated, in order, into ``files`` gzip files under
    ``directory`` until there are at least ``min_rows``: a small split streamed through several
    shuffle windows, as large data is (one copy inside one window measures a reader that never
    leaves its first buffer). Returns the data, its rows and the rows of one copy."""
    import tensorflow as tf

    records = [
        r.numpy()
        for r in tf.data.TFRecordDataset(list(like.train_files), compression_type=like.compression)
    ]
    if not records:
        raise RuntimeError(f"no training records in {like.train_files}")
    copies = max(1, -(-min_rows // len(records)))
    split = directory / "Split-train"
    split.mkdir(parents=True, exist_ok=True)
    paths = [str(split / f"part-{i:05d}.gz") for i in range(files)]
    writers = [tf.io.TFRecordWriter(path, options="GZIP") for path in paths]
    try:
        for copy in range(copies):
            writer = writers[copy % files]
            for record in records:
                writer.write(record)
    finally:
        for writer in writers:
            writer.close()
    data = dataclasses.replace(
        like,
        name=f"{like.name}-repeated",
        train_files=tuple(paths),
        examples_uri=str(directory),
        compression="GZIP",
    )
    return data, copies * len(records), len(records)


def transform_prefix_config(
    *, output_dir: str, spec: DataSpec, beam: BeamConfig, name: str = "fullthrottle-bench"
) -> Config:
    """A config for the pipeline's data prefix; cache off so every run does the work."""
    base = load_config(None)
    return dataclasses.replace(
        base,
        pipeline_name=name,
        output_dir=output_dir,
        enable_cache=False,
        data=spec,
        beam=beam,
    )


def write_tabular_parquet(csv_path: Path, path: Path) -> Path:
    """The rows of a generated CSV (``write_tabular_csv``) as one Parquet file, column types
    as pyarrow's CSV reader infers them (strings, doubles, int64), read and written in batches."""
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    reader = pa_csv.open_csv(csv_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, reader.schema) as writer:
        for batch in reader:
            writer.write_batch(batch)
    return path


def run_transform_prefix(config: Config) -> dict[str, Any]:
    """Runs the real pipeline up to and including Transform (ExampleGen, StatisticsGen, the
    schema, ExampleValidator, the data gate, Transform — the same nodes and code as
    ``fullthrottle run``, without Trainer/Evaluator/Pusher) and returns the per-component
    seconds from MLMD and the wall time."""
    return run_pipeline_prefix(config, last="Transform")


def run_pipeline_prefix(config: Config, *, last: str) -> dict[str, Any]:
    """Stages the data (timed) and runs the real pipeline up to and including the component
    `last` and what it depends on (the same nodes and code as ``fullthrottle run``); returns
    the per-component seconds from MLMD and the wall time."""
    from tfx import v1 as tfx

    from fullthrottle.core.staging import prepare_data
    from fullthrottle.outcome import read_latest_run
    from pipelines.local_runner import build_local_pipeline, run_pipeline

    staging_started = time.perf_counter()
    prepared = prepare_data(config)
    staging_seconds = time.perf_counter() - staging_started
    full = build_local_pipeline(config, input_base=prepared.input_base)
    # Transform and what it depends on, in the pipeline's order (not the baseline resolver,
    # which only the Evaluator reads).
    needed = [next(c for c in full.components if c.id == last)]
    for node in needed:
        needed += [up for up in node.upstream_nodes if up not in needed]
    prefix = [c for c in full.components if c in needed]
    # The dropped nodes (Trainer, Evaluator, Pusher) are still linked as downstream of these.
    for node in prefix:
        for downstream in list(node.downstream_nodes):
            if downstream not in prefix:
                node.remove_downstream_node(downstream)
    pipeline = tfx.dsl.Pipeline(
        pipeline_name=full.pipeline_info.pipeline_name,
        pipeline_root=full.pipeline_info.pipeline_root,
        components=prefix,
        enable_cache=False,
        metadata_connection_config=full.metadata_connection_config,
        beam_pipeline_args=full.beam_pipeline_args,
    )
    started = time.perf_counter()
    run_pipeline(pipeline)
    wall = time.perf_counter() - started
    outcome = read_latest_run(str(config.mlmd_path))
    seconds = {name: comp.seconds for name, comp in outcome.components.items()} if outcome else {}
    return {
        "rows": prepared.rows,
        "wall_seconds": wall,
        "staging_seconds": staging_seconds,
        "component_seconds": seconds,
        "input_base": prepared.input_base,
        "beam_pipeline_args": list(full.beam_pipeline_args),
    }


def time_example_gens(
    input_base: str,
    work: Path,
    *,
    beam_pipeline_args: Sequence[str] = (),
    kinds: Sequence[str] = ("stock", "arrow"),
) -> dict[str, float]:
    """Seconds (from MLMD) of TFX's stock ``CsvExampleGen`` ("stock") and the pipeline's Arrow
    ExampleGen ("arrow") on the same staged splits (`kinds`: which of them), each alone in a
    pipeline, cache off, one after the other."""
    from tfx import v1 as tfx

    from components.arrow_example_gen import example_gen
    from fullthrottle.core.splits import SPLITS
    from fullthrottle.outcome import read_latest_run
    from pipelines.local_runner import run_pipeline

    input_config = tfx.proto.Input(
        splits=[tfx.proto.Input.Split(name=name, pattern=f"{name}/*") for name in SPLITS]
    )
    makers = {
        "stock": lambda: tfx.components.CsvExampleGen(
            input_base=input_base, input_config=input_config
        ),
        "arrow": lambda: example_gen(input_base=input_base, input_config=input_config),
    }
    seconds = {}
    for name in kinds:
        make = makers[name]
        root = work / f"example-gen-{name}"
        mlmd = root / "metadata.sqlite"
        root.mkdir(parents=True, exist_ok=True)
        component = make()
        run_pipeline(
            tfx.dsl.Pipeline(
                pipeline_name=f"fullthrottle-bench-example-gen-{name}",
                pipeline_root=str(root / "pipeline"),
                components=[component],
                enable_cache=False,
                metadata_connection_config=(
                    tfx.orchestration.metadata.sqlite_metadata_connection_config(str(mlmd))
                ),
                beam_pipeline_args=list(beam_pipeline_args),
            )
        )
        outcome = read_latest_run(str(mlmd))
        assert outcome is not None, f"no run recorded in {mlmd}"
        seconds[name] = outcome.components[component.id].seconds
    return seconds


# The steps of a first run to the first training step, as MLMD names the components.
FIRST_RUN_STEPS = ("ExampleGen", "StatisticsGen", "DataGate", "Transform")


def first_run(config: Config) -> dict[str, Any]:
    """A first run of `config` to the first training step: staging, then the real pipeline up
    to and including the Trainer (training one loop of steps, evaluating one batch); each
    step's seconds, the Trainer's up to the end of its first loop of steps."""
    training = dataclasses.replace(
        config.training, train_steps=config.training.steps_per_loop, eval_steps=1
    )
    outcome = run_pipeline_prefix(dataclasses.replace(config, training=training), last="Trainer")
    seconds = outcome["component_seconds"]
    steps = {"staging": outcome["staging_seconds"]}
    for step in FIRST_RUN_STEPS:
        steps[step] = next((v for k, v in seconds.items() if k.endswith(step)), None)
    steps["Trainer to the first step"] = trainer_first_step_seconds(str(config.mlmd_path))
    return {**outcome, "step_seconds": steps}


def trainer_first_step_seconds(mlmd_path: str) -> float:
    """Seconds from the start of the newest run's Trainer execution (MLMD) to the end of its
    first loop of steps (the wall time of the first training scalar in its TensorBoard logs)."""
    import tensorflow as tf

    from fullthrottle.outcome import latest_run, open_store, run_executions

    store = open_store(mlmd_path, read_only=True)
    run = latest_run(store)
    assert run is not None, f"no run recorded in {mlmd_path}"
    trainer = next(e for e in run_executions(store, run) if e.component.endswith("Trainer"))
    started = trainer.execution.create_time_since_epoch / 1000.0
    (model_run,) = [
        artifact.uri
        for artifact in store.get_artifacts_by_id(
            [
                event.artifact_id
                for event in store.get_events_by_execution_ids([trainer.execution.id])
                if event.type == event.OUTPUT
            ]
        )
        if "model_run" in artifact.uri
    ]
    files = tf.io.gfile.glob(os.path.join(model_run, "logs", "**", "events.out.tfevents.*"))
    files += tf.io.gfile.glob(os.path.join(model_run, "logs", "events.out.tfevents.*"))
    first = min(
        event.wall_time
        for path in files
        for event in tf.compat.v1.train.summary_iterator(path)
        if event.step > 0 and event.summary.value
    )
    return first - started


def in_child(function: Any, *args: Any, job: Path) -> tuple[Any, float]:
    """``function(*args)`` (a module-level function) in a fresh process,
    ``python -m fullthrottle.bench.workloads job`` (the request and the result are pickled in
    the folder `job`): its result and the peak resident set size, in bytes, of the largest
    process it ran (itself or a child it waited for, such as a Beam worker)."""
    import pickle

    from fullthrottle.bench.model_process import run_job

    job.mkdir(parents=True, exist_ok=True)
    (job / "request.pickle").write_bytes(pickle.dumps((function, args)))
    result_path = job / "result.pickle"
    run_job(
        "fullthrottle.bench.workloads",
        job,
        result_path,
        getattr(function, "__name__", str(function)),
    )
    return pickle.loads(result_path.read_bytes())


def _child(job: Path) -> None:
    """The process `in_child` starts: runs the pickled request, pickles its result and the
    peak RSS."""
    import pickle
    import resource

    function, args = pickle.loads((job / "request.pickle").read_bytes())
    result = function(*args)
    peak_kib = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    tmp = job / "result.pickle.tmp"
    tmp.write_bytes(pickle.dumps((result, peak_kib * 1024.0)))
    tmp.replace(job / "result.pickle")


def example_gen_name(seconds: dict[str, float]) -> str:
    return next(n for n in seconds if n.endswith("ExampleGen"))


def raw_eval_examples(pipeline_root: str, *, label: str, limit: int) -> Sequence[bytes]:
    """Serialized raw tf.Examples of ExampleGen's eval split, label removed (serving input)."""
    import tensorflow as tf

    files = sorted(
        glob.glob(os.path.join(pipeline_root, "*ExampleGen", "examples", "*", "Split-eval", "*"))
    )
    out = []
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP").take(limit):
        example = tf.train.Example.FromString(record.numpy())
        del example.features.feature[label]
        out.append(example.SerializeToString())
    return out


if __name__ == "__main__":
    import sys

    _child(Path(sys.argv[1]))
