"""fullthrottle's training-loop library: a distributed, mixed-precision ``tf.function`` loop.

Module split: ``config`` (what to do, validated), ``models`` (the registry), ``hardware``
(what this machine can do), ``strategy`` (where), ``precision`` (in which dtype), ``inputs``
(data), ``optimization``, ``setup`` (strategy, precision, model and optimizer, in order),
``loop`` (the compiled N-step inner loop), ``controller`` (the outer loop) and its actions:
``checkpoints`` (restore, cadence), ``summaries`` (TensorBoard), ``profiler`` (the window),
``evaluation``; ``results`` (RunFacts, TrainResult), ``hooks`` (TrainingHook), ``metrics`` (the
names of what is measured), ``advisor`` (what to change).
"""

from trainer_module.training.config import (
    BatchSizes,
    ModelInputs,
    TrainingConfig,
    resolve_batch_sizes,
    scaled_learning_rate,
)
from trainer_module.training.controller import train
from trainer_module.training.errors import (
    CheckpointUnreadableError,
    ConfigError,
    InputDataError,
    TrainingDivergedError,
    TrainingError,
    TrainingInterrupted,
)
from trainer_module.training.hooks import TrainingHook
from trainer_module.training.inputs import (
    distribute_input,
    make_dataset,
    make_distributed_dataset,
    validate_feature_spec,
)
from trainer_module.training.models import MODELS, build_model, build_serving_model
from trainer_module.training.optimization import WarmupSchedule, create_optimizer
from trainer_module.training.precision import dtype_policy, resolve_precision_policy
from trainer_module.training.results import SUMMARY_FILE, RunFacts, TrainResult
from trainer_module.training.strategy import cluster_info, create_strategy

__all__ = [
    "BatchSizes",
    "MODELS",
    "CheckpointUnreadableError",
    "ConfigError",
    "InputDataError",
    "ModelInputs",
    "RunFacts",
    "SUMMARY_FILE",
    "TrainResult",
    "TrainingConfig",
    "TrainingDivergedError",
    "TrainingError",
    "TrainingInterrupted",
    "TrainingHook",
    "WarmupSchedule",
    "build_model",
    "build_serving_model",
    "cluster_info",
    "create_optimizer",
    "create_strategy",
    "distribute_input",
    "dtype_policy",
    "make_dataset",
    "make_distributed_dataset",
    "resolve_batch_sizes",
    "resolve_precision_policy",
    "scaled_learning_rate",
    "train",
    "validate_feature_spec",
]
