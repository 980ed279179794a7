"""The outer loop: everything around the compiled N-step loop.

Owns: strategy/precision/model/optimizer set-up, checkpoint restore and save, the host-side
clock, TensorBoard summaries, the profiler window, divergence handling, eval, the float32
serving twin, and calling hooks (chief only). Refuses: training on data whose spec lacks a
model input, and exporting anything after a non-finite loss.

Sync points (host waits for the device) are deliberate and few: once per loop, when the loop's
counters are read. Nothing inside a loop touches the host.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from trainer_module.training import metrics
from trainer_module.training.checkpoints import TracedWriteCheckpoint
from trainer_module.training.config import (
    ModelInputs,
    TrainingConfig,
    resolve_batch_sizes,
    scaled_learning_rate,
)
from trainer_module.training.errors import InputDataError, TrainingDivergedError
from trainer_module.training.hooks import TrainingHook
from trainer_module.training.inputs import (
    make_distributed_dataset,
    resolve_cache,
    validate_feature_spec,
)
from trainer_module.training.loop import TrainLoop
from trainer_module.training.models import (
    build_model,
    build_serving_model,
    training_model_options,
)
from trainer_module.training.optimization import create_optimizer, current_learning_rate
from trainer_module.training.precision import loss_scale_variable, resolve_precision_policy
from trainer_module.training.results import RunFacts, TrainResult
from trainer_module.training.strategy import cluster_info, create_strategy, strategy_name

# The `tensorboard` package (which implements tf.summary.scalar) is not in the locked
# environment; tf.summary.write with the scalar plugin's metadata writes the identical event.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
)


def _scalar(name: str, value: float, step: int) -> None:
    tf.summary.write(name, tf.constant(value, tf.float32), step=step, metadata=_SCALAR_METADATA)


def _invalid_data_error(e: tf.errors.InvalidArgumentError, step: int) -> Exception:
    """A parse/lookup failure inside the loop means the data and the spec disagree: say so
    (with TF's line that names the feature) instead of a graph-execution stack."""
    lines = [ln.strip() for ln in (e.message or str(e)).splitlines() if ln.strip()]
    hits = [ln for ln in lines if "Feature" in ln or "not in [" in ln]
    if not hits:
        return e
    return InputDataError(
        f"the training data does not match the feature spec / ModelInputs (near step {step}): "
        f"{hits[0]}. Check that Transform wrote every feature ModelInputs names, with the "
        "declared shape, and that id features are within their cardinality."
    )


def _agree_any(strategy: tf.distribute.Strategy, flag: bool, num_workers: int) -> bool:
    """True if any worker says True (wall-clock decisions must match on every worker)."""
    if num_workers <= 1:
        return flag
    value = strategy.run(lambda: tf.constant(1.0 if flag else 0.0))
    return bool(strategy.reduce(tf.distribute.ReduceOp.MAX, value, axis=None).numpy() > 0.5)


def _next_loop_length(step: int, config: TrainingConfig) -> int:
    """Steps in the next loop: steps_per_loop, cut at the end, at checkpoint steps and at the
    profiler window's edges, so those happen exactly on their step."""
    n = min(config.steps_per_loop, config.train_steps - step)
    if config.checkpoint_every_steps:
        n = min(n, config.checkpoint_every_steps - step % config.checkpoint_every_steps)
    if config.profile_steps:
        for edge in config.profile_steps:
            if step < edge:
                n = min(n, edge - step)
    return max(n, 1)


def train(
    *,
    config: TrainingConfig,
    model_inputs: ModelInputs,
    feature_spec: Mapping[str, tf.io.FixedLenFeature],
    train_files: Sequence[str],
    eval_files: Sequence[str],
    work_dir: str,
    compression: str | None = "GZIP",
    hooks: Sequence[TrainingHook] = (),
) -> TrainResult:
    """Train (resuming from ``work_dir/checkpoints`` if a checkpoint is there), evaluate, and
    return the float32 serving model (chief only). Writes: ``work_dir/checkpoints/`` (chief;
    other workers use a temporary directory that is removed afterwards), ``work_dir/logs/``
    (TensorBoard, chief) and ``work_dir/profile/`` (profiler, chief, if ``profile_steps``).

    Raises ConfigError / InputDataError before any training on bad config or spec, and
    TrainingDivergedError (nothing exported, no checkpoint written) on a non-finite loss.
    """
    # Cheap, TF-free refusals first.
    validate_feature_spec(feature_spec, model_inputs)
    model_kind = config.resolved_model(model_inputs)
    if not train_files:
        raise InputDataError("`train_files` is empty")
    info = cluster_info()
    # Multi-worker collectives must be configured before TF initialises: strategy first.
    strategy = create_strategy(config)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()  # process-wide and irreversible (TF)
    keras.utils.set_random_seed(config.seed)  # same initial weights on every replica/worker
    policy_name, policy_reason = resolve_precision_policy(config)
    batch = resolve_batch_sizes(config, strategy.num_replicas_in_sync)
    peak_lr = scaled_learning_rate(config, batch.global_batch)

    with strategy.scope():
        model = build_model(model_inputs, config, policy_name, **training_model_options(config))
        optimizer = create_optimizer(config, peak_lr, policy_name)
        # Build slots now so a checkpoint restores into existing variables (no deferred
        # restore, which Keras 3 optimizers do not support).
        optimizer.build(model.trainable_variables)
    loop = TrainLoop(strategy, model, optimizer, config, batch)

    chief_ckpt_dir = os.path.join(work_dir, "checkpoints")
    # Keras keeps dropout RNG state in SeedGenerator variables that tf.train.Checkpoint does not
    # reach through the model; without them a resumed run would redraw the first run's masks.
    rng_state = tf.train.Checkpoint(
        **{
            f"seed{i}": v.value
            for i, v in enumerate(model.non_trainable_variables)
            if "seed_generator_state" in v.path
        }
    )
    saved = {"model": model, "optimizer": optimizer, "step": loop.step, "rng_state": rng_state}
    checkpoint = (
        tf.train.Checkpoint(**saved)
        if info.num_workers > 1 or not config.traced_checkpoint_saves
        else TracedWriteCheckpoint(
            structure_key=lambda: (len(model.variables), len(optimizer.variables)), **saved
        )
    )
    own_tmp = None
    if info.is_chief:
        ckpt_dir = chief_ckpt_dir
    else:
        # TF's multi-worker guide: every worker saves (saving may run collectives), but only
        # the chief's copy is kept; the others write to a private temporary place.
        own_tmp = tempfile.mkdtemp(prefix=f"fullthrottle-worker{info.worker_index}-ckpt-")
        ckpt_dir = own_tmp
    manager = tf.train.CheckpointManager(
        checkpoint, ckpt_dir, max_to_keep=config.checkpoints_to_keep
    )
    latest = tf.train.latest_checkpoint(chief_ckpt_dir)  # every worker restores the chief's
    if latest:
        checkpoint.restore(latest).assert_existing_objects_matched()
    start_step = int(loop.step.numpy())
    # Decided here once for the record (make_dataset applies the same rule per pipeline shard).
    input_cached, input_cache_reason = resolve_cache(config, train_files)

    train_ds = make_distributed_dataset(
        strategy,
        train_files,
        feature_spec,
        model_inputs,
        config,
        per_replica_batch_size=batch.per_replica_step,
        training=True,
        compression=compression,
        start_step=start_step,
    )
    iterator = iter(train_ds)

    chief = info.is_chief
    hooks = tuple(hooks) if chief else ()
    writer = (
        tf.summary.create_file_writer(os.path.join(work_dir, "logs", "train"))
        if chief
        else tf.summary.create_noop_writer()
    )
    scale_var = loss_scale_variable(optimizer)
    facts = RunFacts(
        strategy_name=strategy_name(strategy),
        num_replicas=strategy.num_replicas_in_sync,
        num_workers=info.num_workers,
        global_batch_size=batch.global_batch,
        per_replica_batch_size=batch.per_replica,
        gradient_accumulation_steps=batch.accumulation_steps,
        learning_rate=peak_lr,
        precision_policy=policy_name,
        precision_reason=policy_reason,
        model_kind=model_kind,
        parameters=int(model.count_params()),
        start_step=start_step,
        train_steps=config.train_steps,
        input_cached=input_cached,
        input_cache_reason=input_cache_reason,
        checkpoint_saves="traced" if isinstance(checkpoint, TracedWriteCheckpoint) else "eager",
        work_dir=work_dir,
    )
    for h in hooks:
        h.on_train_begin(facts)

    history: list[dict[str, Any]] = []
    step = start_step
    last_saved = start_step
    last_save_time = time.monotonic()
    profiling = False
    try:
        while step < config.train_steps:
            n = _next_loop_length(step, config)
            if chief and config.profile_steps and not profiling:
                p0, p1 = config.profile_steps
                if p0 <= step < p1:
                    tf.profiler.experimental.start(os.path.join(work_dir, "profile"))
                    profiling = True
            t0 = time.perf_counter()
            try:
                ran = int(loop.train_loop(iterator, tf.constant(n, tf.int64)))  # host sync
            except tf.errors.InvalidArgumentError as e:
                raise _invalid_data_error(e, step + 1) from e
            wall = time.perf_counter() - t0
            bad = int(loop.bad_step.numpy())
            if bad >= 0:
                raise TrainingDivergedError(
                    bad, float(loop.last_loss.numpy()), current_learning_rate(optimizer)
                )
            step += ran
            if profiling and step >= config.profile_steps[1]:
                tf.profiler.experimental.stop()
                profiling = False
            wait = float(loop.input_wait.numpy())
            record = {
                metrics.STEP: step,
                metrics.LOSS: float(loop.loss_sum.numpy()) / max(ran, 1),
                metrics.LEARNING_RATE: current_learning_rate(optimizer),
                metrics.EXAMPLES_PER_SECOND: ran * batch.global_batch / wall,
                metrics.INPUT_WAIT_FRACTION: min(wait / wall, 1.0),
                metrics.LOSS_SCALE: float(scale_var.numpy()) if scale_var is not None else None,
                metrics.STEP_TIME: wall / max(ran, 1),
                metrics.STEPS: ran,
                metrics.WALL_TIME: wall,
                metrics.INPUT_WAIT_TIME: wait,
            }
            history.append(record)
            with writer.as_default():
                for key in metrics.LOOP_SCALARS:
                    if record[key] is not None:
                        _scalar(key, record[key], step)
            for h in hooks:
                h.on_loop_end(step, dict(record))

            due = step == config.train_steps or (
                config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0
            )
            if config.checkpoint_every_seconds is not None and not due:
                late = time.monotonic() - last_save_time >= config.checkpoint_every_seconds
                due = _agree_any(strategy, late, info.num_workers)
            save_seconds = 0.0
            if due and step != last_saved:
                save_start = time.perf_counter()
                path = manager.save(checkpoint_number=step)
                save_seconds = time.perf_counter() - save_start
                last_saved, last_save_time = step, time.monotonic()
                for h in hooks:
                    h.on_checkpoint(step, path)
            # Where the time between loops went (the advisor's "outside the loop" share): the
            # host's work after this loop (reads, summaries, hooks, checkpoint) until the next
            # one starts. The save at the end of training is kept apart: every run pays it once,
            # whatever its checkpoint cadence.
            final = step >= config.train_steps
            record[metrics.CHECKPOINT_TIME] = 0.0 if final else save_seconds
            record[metrics.FINAL_CHECKPOINT_TIME] = save_seconds if final else 0.0
            record[metrics.HOST_TIME] = (
                time.perf_counter() - (t0 + wall) - record[metrics.FINAL_CHECKPOINT_TIME]
            )
    finally:
        if profiling:
            tf.profiler.experimental.stop()
        writer.flush()

    eval_metrics: dict[str, float] = {}
    if eval_files:
        eval_ds = make_distributed_dataset(
            strategy,
            eval_files,
            feature_spec,
            model_inputs,
            config,
            per_replica_batch_size=batch.per_replica,
            training=False,
            compression=compression,
        )
        max_steps = config.eval_steps or 2**62
        loss_sum, correct, count = (
            float(v) for v in loop.eval_loop(iter(eval_ds), tf.constant(max_steps, tf.int64))
        )
        if count:
            eval_metrics = {
                metrics.EVAL_LOSS: loss_sum / count,
                metrics.EVAL_ACCURACY: correct / count,
                metrics.EVAL_EXAMPLES: count,
            }
            with writer.as_default():
                for key in metrics.EVAL_SCALARS:
                    _scalar(metrics.eval_metric_name(key), eval_metrics[key], step)
            writer.flush()

    # Throughput over the steady state: drop the first loop (it includes tracing/compiling)
    # when there is more than one.
    steady = history[1:] if len(history) > 1 else history
    wall = sum(r[metrics.WALL_TIME] for r in steady)
    examples = sum(r[metrics.STEPS] for r in steady) * batch.global_batch
    serving = build_serving_model(model, model_inputs, config) if chief else None
    if own_tmp:
        shutil.rmtree(own_tmp, ignore_errors=True)
    result = TrainResult(
        facts=facts,
        serving_model=serving,
        is_chief=chief,
        steps_completed=step,
        final_loss=history[-1][metrics.LOSS] if history else math.nan,
        eval_metrics=eval_metrics,
        examples_per_second=examples / wall if wall else 0.0,
        input_wait_fraction=(sum(r[metrics.INPUT_WAIT_TIME] for r in steady) / wall)
        if wall
        else 0.0,
        loss_scale_skipped_steps=int(loop.step.numpy()) - int(optimizer.iterations.numpy()),
        checkpoint_dir=ckpt_dir,
        history=tuple(history),
        model=model,
    )
    for h in hooks:
        h.on_train_end(result)
    return result
