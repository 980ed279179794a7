"""The names of the training metrics, spelled once.

The controller writes a loop record per N-step loop under these keys (``TrainResult.history``,
``TrainingHook.on_loop_end``); the run's summary (``training_summary.json``) uses the summary
names. Where metrics are charted (TensorBoard, MLflow) each is ``<group>/<name>``: both UIs
group charts by the part before the "/", so the loop's scalars and the run's summary values are
``train/<name>`` (``chart_name``) and the Trainer's own evaluation ``eval/<name>``
(``eval_chart_name``). Everything that writes or reads one of these imports it from here.
"""

from __future__ import annotations

# --- one loop's record --------------------------------------------------------------------------
STEP = "step"  # the global step at the loop's end
LOSS = "loss"  # mean training loss over the loop's steps
LEARNING_RATE = "learning_rate"  # the rate the next update will use
EXAMPLES_PER_SECOND = "examples_per_second"  # global examples / loop wall time
INPUT_WAIT_FRACTION = "input_wait_fraction"  # time blocked on input / loop wall time
LOSS_SCALE = "loss_scale"  # float16's dynamic loss scale; None for other policies
STEP_TIME = "step_time"  # loop wall time / steps
STEPS = "steps"  # steps the loop ran
WALL_TIME = "wall_time"  # seconds, host clock, around the compiled loop
INPUT_WAIT_TIME = "input_wait_time"  # seconds blocked on input inside the loop
# Added to the history's record after the hooks have seen it: the host's work after the loop.
CHECKPOINT_TIME = "checkpoint_time"  # a periodic save after this loop (0 if none)
FINAL_CHECKPOINT_TIME = "final_checkpoint_time"  # the save at the end of training
HOST_TIME = "host_time"  # after the loop until the next starts, the final save excluded

# The loop's scalars: TensorBoard (at the loop's step) and the MLflow hook's per-loop metrics.
LOOP_SCALARS = (
    LOSS,
    LEARNING_RATE,
    EXAMPLES_PER_SECOND,
    STEP_TIME,
    INPUT_WAIT_FRACTION,
    LOSS_SCALE,
)

# --- evaluation (``TrainResult.eval_metrics``) ------------------------------------------------------
EVAL_LOSS = "loss"
EVAL_ACCURACY = "accuracy"  # classification
EVAL_MAE = "mae"  # regression: mean absolute error, in the label's units
EVAL_RMSE = "rmse"  # regression: root mean squared error
EVAL_EXAMPLES = "examples"
EVAL_SCALARS = (EVAL_LOSS, EVAL_ACCURACY, EVAL_MAE, EVAL_RMSE)  # written to TensorBoard


# --- charted names (TensorBoard tags, MLflow metric keys) ------------------------------------------
TRAIN_GROUP = "train"
EVAL_GROUP = "eval"


def chart_name(name: str) -> str:
    """A training metric where it is charted: ``train/loss``."""
    return f"{TRAIN_GROUP}/{name}"


def eval_chart_name(name: str) -> str:
    """An evaluation metric of the Trainer where it is charted: ``eval/accuracy``."""
    return f"{EVAL_GROUP}/{name}"


# --- the run's summary (``TrainResult``, ``training_summary.json``) ------------------------------
FINAL_LOSS = "final_loss"  # the last loop's loss
STEPS_COMPLETED = "steps_completed"
LOSS_SCALE_SKIPPED_STEPS = "loss_scale_skipped_steps"
# Steady-state rates over the run (the first, tracing loop left out): the same names as the
# loop's, and ``mean_<name>`` where they are logged beside the loops' own points.
SUMMARY_METRICS = (FINAL_LOSS, EXAMPLES_PER_SECOND, INPUT_WAIT_FRACTION, STEPS_COMPLETED)
# Model FLOPs utilization: achieved FLOP/s over the device's measured matmul ceiling (gpu-check,
# the benchmark).
MFU = "mfu"
MEAN_EXAMPLES_PER_SECOND = f"mean_{EXAMPLES_PER_SECOND}"
MEAN_INPUT_WAIT_FRACTION = f"mean_{INPUT_WAIT_FRACTION}"

# --- derived params: what the run resolved, logged as params (name, ``RunFacts`` field) ----------
# Two of the ``RunFacts`` fields, as the summary (``training_summary.json``) names them.
PRECISION_POLICY = "precision_policy"
STRATEGY_NAME = "strategy_name"
DERIVED_PARAMS = (
    ("num_replicas", "num_replicas"),
    ("num_workers", "num_workers"),
    ("global_batch_size", "global_batch_size"),
    ("per_replica_batch_size", "per_replica_batch_size"),
    ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    (PRECISION_POLICY, PRECISION_POLICY),
    ("scaled_learning_rate", "learning_rate"),
    ("strategy", STRATEGY_NAME),
    ("model", "model_kind"),
    ("parameters", "parameters"),
)
