"""The outer loop: a small controller around the compiled N-step loop.

Orbit's split: :mod:`setup` builds strategy, precision, model and optimizer; the
:class:`checkpoints.CheckpointStore` restores; :class:`loop.TrainLoop` runs N steps per call;
between calls the controller sizes the next loop, keeps the loop's record and timing, and calls
its actions — summaries (:mod:`summaries`), the profiler window (:mod:`profiler`), the
checkpoint cadence (:class:`checkpoints.CheckpointAction`) — and the hooks (chief only); at the
end evaluation (:mod:`evaluation`) and the float32 serving twin (``models.build_serving_model``).
Refuses: training on data whose spec lacks a model input, and exporting anything after a
non-finite loss.

Sync points (host waits for the device) are deliberate and few: once per loop, when the loop's
counters are read. Nothing inside a loop touches the host.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from trainer_module.training import metrics
from trainer_module.training.checkpoints import (
    CheckpointAction,
    CheckpointStore,
    training_checkpoint,
)
from trainer_module.training.config import ModelInputs, TrainingConfig
from trainer_module.training.errors import (
    InputDataError,
    TrainingDivergedError,
    TrainingInterrupted,
)
from trainer_module.training.evaluation import evaluate
from trainer_module.training.hooks import TrainingHook
from trainer_module.training.inputs import (
    make_distributed_dataset,
    resolve_cache,
    validate_feature_spec,
)
from trainer_module.training.interrupt import StopBetweenLoops
from trainer_module.training.loop import TrainLoop
from trainer_module.training.models import build_serving_model
from trainer_module.training.optimization import current_learning_rate
from trainer_module.training.precision import loss_scale_variable
from trainer_module.training.profiler import ProfilerWindow
from trainer_module.training.results import RunFacts, TrainResult
from trainer_module.training.setup import TrainingSetup, set_up
from trainer_module.training.strategy import agree_any, strategy_name
from trainer_module.training.summaries import Summaries


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


def _loop_record(
    loop: TrainLoop, *, step: int, ran: int, wall: float, scale_var: tf.Variable | None
) -> dict[str, Any]:
    """The history record of the loop that ran ``ran`` steps in ``wall`` seconds, ending at
    ``step`` (reads the loop's counters, the learning rate and the loss scale: the sync point)."""
    wait = float(loop.input_wait.numpy())
    return {
        metrics.STEP: step,
        metrics.LOSS: float(loop.loss_sum.numpy()) / max(ran, 1),
        metrics.LEARNING_RATE: current_learning_rate(loop.optimizer),
        metrics.EXAMPLES_PER_SECOND: ran * loop.batch.global_batch / wall,
        metrics.INPUT_WAIT_FRACTION: min(wait / wall, 1.0),
        metrics.LOSS_SCALE: float(scale_var.numpy()) if scale_var is not None else None,
        metrics.STEP_TIME: wall / max(ran, 1),
        metrics.STEPS: ran,
        metrics.WALL_TIME: wall,
        metrics.INPUT_WAIT_TIME: wait,
    }


def _run_facts(
    setup: TrainingSetup,
    config: TrainingConfig,
    *,
    start_step: int,
    input_cache: tuple[bool, str],
    checkpoint_saves: str,
    work_dir: str,
    unreadable_checkpoints: tuple[str, ...],
) -> RunFacts:
    return RunFacts(
        strategy_name=strategy_name(setup.strategy),
        num_replicas=setup.strategy.num_replicas_in_sync,
        num_workers=setup.cluster.num_workers,
        global_batch_size=setup.batch.global_batch,
        per_replica_batch_size=setup.batch.per_replica,
        gradient_accumulation_steps=setup.batch.accumulation_steps,
        learning_rate=setup.learning_rate,
        precision_policy=setup.policy_name,
        precision_reason=setup.policy_reason,
        model_kind=setup.model_kind,
        parameters=int(setup.model.count_params()),
        start_step=start_step,
        train_steps=config.train_steps,
        input_cached=input_cache[0],
        input_cache_reason=input_cache[1],
        checkpoint_saves=checkpoint_saves,
        work_dir=work_dir,
        unreadable_checkpoints=unreadable_checkpoints,
    )


def _train_loops(
    loop: TrainLoop,
    iterator: Any,
    config: TrainingConfig,
    *,
    start_step: int,
    checkpoint: CheckpointAction,
    summaries: Summaries,
    profiler: ProfilerWindow,
    hooks: Sequence[TrainingHook],
    stop: StopBetweenLoops,
    agree: Any,
) -> list[dict[str, Any]]:
    """Loops from ``start_step`` to ``config.train_steps``, each followed by its actions; the
    loops' history records. After each loop, a stop asked by a signal on any worker (``agree``:
    an all-reduce over workers) saves a checkpoint at that step and raises
    TrainingInterrupted on every worker, at the same step."""
    scale_var = loss_scale_variable(loop.optimizer)
    history: list[dict[str, Any]] = []
    step = start_step
    while step < config.train_steps:
        # Loops end exactly at checkpoint steps and the profiler window's edges.
        edges = (checkpoint.steps_to_next(step), profiler.steps_to_edge(step))
        n = min(config.steps_per_loop, config.train_steps - step, *(e for e in edges if e))
        profiler.before_loop(step)
        t0 = time.perf_counter()
        try:
            ran = int(loop.train_loop(iterator, tf.constant(n, tf.int64)))  # host sync
        except tf.errors.InvalidArgumentError as e:
            raise _invalid_data_error(e, step + 1) from e
        wall = time.perf_counter() - t0
        bad = int(loop.bad_step.numpy())
        if bad >= 0:
            raise TrainingDivergedError(
                bad, float(loop.last_loss.numpy()), current_learning_rate(loop.optimizer)
            )
        step += ran
        profiler.after_loop(step)
        record = _loop_record(loop, step=step, ran=ran, wall=wall, scale_var=scale_var)
        history.append(record)
        summaries.write_loop(record, step)
        for h in hooks:
            h.on_loop_end(step, dict(record))
        path, save_seconds = checkpoint(step)
        if path is not None:
            for h in hooks:
                h.on_checkpoint(step, path)
        # Where the time between loops went (the advisor's "outside the loop" share): the host's
        # work after this loop (reads, summaries, hooks, checkpoint) until the next one starts.
        # The save at the end of training is kept apart: every run pays it once, whatever its
        # checkpoint cadence.
        final = step >= config.train_steps
        record[metrics.CHECKPOINT_TIME] = 0.0 if final else save_seconds
        record[metrics.FINAL_CHECKPOINT_TIME] = save_seconds if final else 0.0
        record[metrics.HOST_TIME] = (
            time.perf_counter() - (t0 + wall) - record[metrics.FINAL_CHECKPOINT_TIME]
        )
        if stop.requested(agree):
            saved, _ = checkpoint.save_now(step)
            if saved is not None and saved != path:
                for h in hooks:
                    h.on_checkpoint(step, saved)
            for h in hooks:
                h.on_interrupt(step, saved)
            raise TrainingInterrupted(stop.signum, step=step, checkpoint=saved)
    return history


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

    Raises ConfigError / InputDataError before any training on bad config or spec,
    CheckpointUnreadableError when checkpoints exist but none can be read (unless
    ``config.unreadable_checkpoints == "start_over"``), TrainingDivergedError (nothing exported,
    no checkpoint written) on a non-finite loss, and TrainingInterrupted after SIGINT/SIGTERM
    (on any worker): at the end of the loop it came in, with a checkpoint written at that step.
    """
    # Cheap, TF-free refusals first (set_up refuses a model the inputs cannot feed).
    validate_feature_spec(feature_spec, model_inputs)
    if not train_files:
        raise InputDataError("`train_files` is empty")
    setup = set_up(config, model_inputs)
    cluster, chief = setup.cluster, setup.cluster.is_chief
    loop = TrainLoop(
        setup.strategy,
        setup.model,
        setup.optimizer,
        config,
        setup.batch,
        regression=model_inputs.regression,
    )
    checkpoints = CheckpointStore(
        training_checkpoint(
            model=setup.model,
            optimizer=setup.optimizer,
            step=loop.step,
            traced=cluster.num_workers == 1 and config.traced_checkpoint_saves,
        ),
        work_dir=work_dir,
        cluster=cluster,
        max_to_keep=config.checkpoints_to_keep,
    )
    checkpoints.restore_latest(unreadable=config.unreadable_checkpoints)
    start_step = int(loop.step.numpy())
    train_ds = make_distributed_dataset(
        setup.strategy,
        train_files,
        feature_spec,
        model_inputs,
        config,
        per_replica_batch_size=setup.batch.per_replica_step,
        training=True,
        compression=compression,
        start_step=start_step,
    )
    hooks = tuple(hooks) if chief else ()
    summaries = Summaries(os.path.join(work_dir, "logs", "train") if chief else None)
    facts = _run_facts(
        setup,
        config,
        start_step=start_step,
        # Decided here once for the record (make_dataset applies the same rule per shard).
        input_cache=resolve_cache(config, train_files),
        checkpoint_saves=checkpoints.saves,
        work_dir=work_dir,
        unreadable_checkpoints=tuple(checkpoints.set_aside),
    )
    for h in hooks:
        h.on_train_begin(facts)

    profiler = ProfilerWindow(
        config.profile_steps, os.path.join(work_dir, "profile"), enabled=chief
    )

    def agree(flag: bool) -> bool:
        return agree_any(setup.strategy, flag, cluster.num_workers)

    try:
        # SIGINT/SIGTERM from here on stop training at the next loop end, with a checkpoint.
        with StopBetweenLoops() as stop:
            history = _train_loops(
                loop,
                iter(train_ds),
                config,
                start_step=start_step,
                checkpoint=CheckpointAction(
                    checkpoints.save,
                    train_steps=config.train_steps,
                    every_steps=config.checkpoint_every_steps,
                    every_seconds=config.checkpoint_every_seconds,
                    start_step=start_step,
                    agree=agree,
                ),
                summaries=summaries,
                profiler=profiler,
                hooks=hooks,
                stop=stop,
                agree=agree,
            )
    except TrainingInterrupted:
        checkpoints.close()
        raise
    finally:
        profiler.close()
        summaries.flush()
    step = history[-1][metrics.STEP] if history else start_step

    eval_metrics = evaluate(
        loop,
        eval_files=eval_files,
        feature_spec=feature_spec,
        model_inputs=model_inputs,
        config=config,
        compression=compression,
    )
    if eval_metrics:
        summaries.write_eval(eval_metrics, step)
    serving = build_serving_model(setup.model, model_inputs, config) if chief else None
    checkpoints.close()
    # Throughput over the steady state: drop the first loop (it includes tracing/compiling)
    # when there is more than one.
    steady = history[1:] if len(history) > 1 else history
    wall = sum(r[metrics.WALL_TIME] for r in steady)
    examples = sum(r[metrics.STEPS] for r in steady) * setup.batch.global_batch
    waited = sum(r[metrics.INPUT_WAIT_TIME] for r in steady)
    result = TrainResult(
        facts=facts,
        serving_model=serving,
        is_chief=chief,
        steps_completed=step,
        final_loss=history[-1][metrics.LOSS] if history else math.nan,
        eval_metrics=eval_metrics,
        examples_per_second=examples / wall if wall else 0.0,
        input_wait_fraction=waited / wall if wall else 0.0,
        loss_scale_skipped_steps=int(loop.step.numpy()) - int(setup.optimizer.iterations.numpy()),
        checkpoint_dir=checkpoints.directory,
        history=tuple(history),
        model=setup.model,
    )
    for h in hooks:
        h.on_train_end(result)
    return result
