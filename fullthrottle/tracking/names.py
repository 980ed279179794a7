"""The names tracking writes into MLflow, spelled once: tags, metric groups, params.

Metric keys are ``<group>/<name>``: MLflow's UI (like TensorBoard) groups charts by the part
before the first "/". The training library spells its own (``train/...``, ``eval/...``,
``trainer_module.training.metrics``); the groups the pipeline's runs add are here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fullthrottle.core.redact import redact_value

# --- tags -------------------------------------------------------------------------------------
RUN_KEY_TAG = "fullthrottle.run_key"  # the pipeline run's identity (config, data, code)
PIPELINE_TAG = "fullthrottle.pipeline_name"
# Which pipeline (name and root, hashed) a parent run belongs to, and when it was last
# (re)started: the Trainer attaches to the newest unfinished parent with its pipeline key.
PIPELINE_KEY_TAG = "fullthrottle.pipeline_key"
ATTACHED_AT_TAG = "fullthrottle.attached_at"
# "Trainer" on a parent run the Trainer's hook made itself (no `fullthrottle run` around it, as
# on Kubeflow): the hook ends such a parent when training ends.
CREATED_BY_TAG = "fullthrottle.created_by"
COMPONENT_TAG = "fullthrottle.component"  # on nested runs: Transform, Trainer, Evaluator
TRAINING_KEY_TAG = "fullthrottle.training_key"  # the Trainer run: its checkpoint folder's key
INTERRUPTED_AT_TAG = "fullthrottle.interrupted_at_step"  # a signal stopped training there
INTERRUPTED_BY_TAG = "fullthrottle.interrupted_by"  # SIGINT or SIGTERM, on the pipeline run
# Checkpoints found unreadable at restore and moved to `checkpoints/unreadable/`.
UNREADABLE_CHECKPOINTS_TAG = "fullthrottle.unreadable_checkpoints"
PUSH_VERSION_TAG = "fullthrottle.push_version"  # on a logged model: the version folder pushed
# Why the Evaluator blessed the new model or not (both models' primary metric), and the latest
# blessed model it was compared with (its Trainer artifact and pushed version).
BLESSING_REASON_TAG = "fullthrottle.blessing_reason"
BASELINE_MODEL_TAG = "fullthrottle.baseline_model"
BASELINE_VERSION_TAG = "fullthrottle.baseline_push_version"

# --- metric groups of the pipeline's runs -------------------------------------------------------
EVALUATOR_GROUP = "evaluator"  # the Evaluator's (TFMA) metrics of the new model
BASELINE_GROUP = "baseline"  # ... of the latest blessed model, measured in the same evaluation
ROWS_GROUP = "rows"  # examples per split (StatisticsGen)
ANOMALIES_GROUP = "anomalies"  # anomalies per split (ExampleValidator)
SECONDS_GROUP = "seconds"  # each component's execution time
TRACKING_GROUP = "tracking"  # what tracking itself cost the Trainer


def metric_name(group: str, name: str) -> str:
    return f"{group}/{name}"


# --- params -----------------------------------------------------------------------------------
MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """{"training": {"seed": 42}} -> {"training.seed": "42"}; lists become JSON; None values are
    left out (a param that is not set is not a param of the run); secrets are masked."""
    flat: dict[str, str] = {}
    if isinstance(data, Mapping):
        for key, value in data.items():
            flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if data is None:
        return flat
    # Column names stay as written in the params (e.g. 温度, not \u6e29\u5ea6).
    value = (
        json.dumps(data, default=str, ensure_ascii=False)
        if isinstance(data, (list, tuple))
        else str(data)
    )
    return {prefix: str(redact_value(prefix, value))[:MAX_PARAM_CHARS]}
