"""What a training run resolved (``RunFacts``) and what it produced (``TrainResult``).

``RunFacts`` is decided once, after restore and before the first loop: the hooks receive it in
``on_train_begin`` and the result carries it. Derived params, the progress line and the run's
summary (``training_summary.json``, one flat JSON object) are all computed from these two types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import keras

from trainer_module.training import metrics

# Written by the Trainer's run_fn beside the TensorBoard logs; read by the CLI's run outcome.
SUMMARY_FILE = "training_summary.json"


@dataclass(frozen=True)
class RunFacts:
    """The run as resolved against this machine and config (the same on every worker)."""

    strategy_name: str  # e.g. "MirroredStrategy" (MultiWorkerMirroredStrategy by that name)
    num_replicas: int
    num_workers: int
    global_batch_size: int  # per_replica x replicas x accumulation
    per_replica_batch_size: int  # examples per replica per micro-batch
    gradient_accumulation_steps: int
    learning_rate: float  # the peak learning rate, scaled for the global batch
    precision_policy: str
    precision_reason: str
    model_kind: str  # the registered model trained ("auto" resolved)
    parameters: int
    start_step: int  # restored from a checkpoint (0 for a fresh run)
    train_steps: int
    input_cached: bool  # training input served from memory (inputs.resolve_cache)
    input_cache_reason: str
    checkpoint_saves: str  # "traced" (single host, checkpoints.TracedWriteCheckpoint) or "eager"
    work_dir: str
    # Checkpoints found unreadable at restore and moved to `checkpoints/unreadable/` (prefixes).
    unreadable_checkpoints: tuple[str, ...] = ()

    def derived_params(self) -> dict[str, Any]:
        return derived_params(dataclasses.asdict(self))


def derived_params(facts: Mapping[str, Any]) -> dict[str, Any]:
    """Param name -> value (``metrics.DERIVED_PARAMS``) from ``RunFacts`` fields, or from a run's
    flat summary, which holds them under the same keys; absent facts are left out."""
    return {name: facts[source] for name, source in metrics.DERIVED_PARAMS if source in facts}


@dataclass(frozen=True)
class TrainResult:
    facts: RunFacts
    serving_model: keras.Model | None  # float32, trained weights; None on non-chief workers
    is_chief: bool
    steps_completed: int
    final_loss: float  # mean training loss over the last loop
    eval_metrics: dict[str, float]  # accuracy, loss, examples ({} when there are no eval files)
    examples_per_second: float  # global examples/s, first (tracing) loop excluded if possible
    input_wait_fraction: float  # time blocked on input / loop wall time, same loops
    loss_scale_skipped_steps: int  # steps whose update was skipped for non-finite gradients
    checkpoint_dir: str  # where THIS worker saved (non-chief: a temp dir, removed at the end)
    history: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    # The model as trained (training dtype policy, strategy-placed variables), on every worker.
    # For export use `serving_model`; this is for checks such as "workers stayed in sync".
    model: keras.Model | None = None

    def summary(self) -> dict[str, Any]:
        """The run as one flat, JSON-ready mapping: the facts' fields and the outcome's, without
        the models (what ``training_summary.json`` holds)."""
        outcome = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("facts", "serving_model", "model")
        }
        outcome["history"] = [dict(record) for record in self.history]
        outcome["eval_metrics"] = dict(self.eval_metrics)
        return {**dataclasses.asdict(self.facts), **outcome}
