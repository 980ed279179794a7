"""The Evaluator's blessing rule, and the words that explain a blessing.

A task has one primary metric with a direction (accuracy: higher is better; an error such as
RMSE: lower is better). A candidate model is blessed when its primary metric

1. reaches the absolute bar of the config (a lower bound when higher is better, an upper bound
   when lower is better), and
2. once a model of the same pipeline has been blessed, is no worse than that model's by more
   than `evaluation.baseline_tolerance` (TFX's `LatestBlessedModelStrategy` finds it; TFMA's
   `GenericChangeThreshold` compares the two).

`BlessingRule` holds exactly that, from the config; `pipelines.pipeline.tfma_eval_config` turns
it into TFMA's EvalConfig (the only place that does), and `explain` turns the Evaluator's verdict
back into a sentence for `last_run.json`, the run's summary and MLflow. Nothing here imports
TFMA: the rule is plain data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fullthrottle.core.config import Config

CLASSIFICATION = "classification"
REGRESSION = "regression"
# `evaluation.baseline`: compare with what TFX's LatestBlessedModelStrategy resolves.
LATEST_BLESSED = "latest_blessed"


@dataclass(frozen=True)
class PrimaryMetric:
    """The metric a task is blessed on: TFMA's metric class, the key TFMA reports it under, its
    direction, and the config field that holds its absolute bar."""

    tfma_class: str
    key: str
    higher_is_better: bool
    bound_field: str

    @property
    def bound_word(self) -> str:
        return "at least" if self.higher_is_better else "at most"


PRIMARY_METRICS: Mapping[str, PrimaryMetric] = {
    CLASSIFICATION: PrimaryMetric(
        tfma_class="SparseCategoricalAccuracy",
        key="sparse_categorical_accuracy",
        higher_is_better=True,
        bound_field="evaluation.accuracy_threshold",
    ),
    REGRESSION: PrimaryMetric(
        tfma_class="MeanAbsoluteError",
        key="mean_absolute_error",
        higher_is_better=False,
        bound_field="evaluation.max_mae",
    ),
}
# What the Evaluator computes and reports beside the primary metric (never judged), by task.
REPORTED_METRICS: Mapping[str, tuple[str, ...]] = {
    CLASSIFICATION: ("SparseCategoricalCrossentropy",),
    REGRESSION: ("RootMeanSquaredError", "MeanSquaredError"),
}
# The key of the serving signatures' output the Evaluator reads, by task.
PREDICTION_KEYS: Mapping[str, str] = {CLASSIFICATION: "probabilities", REGRESSION: "predictions"}


@dataclass(frozen=True)
class BlessingRule:
    """How a candidate is judged: the task's primary metric, its absolute bar, and how much worse
    than the latest blessed model it may be (None: no comparison with a baseline)."""

    task: str
    metric: PrimaryMetric
    bound: float
    baseline_tolerance: float | None

    @classmethod
    def from_config(cls, config: Config) -> BlessingRule:
        evaluation = config.evaluation
        task = config.data.task
        metric = PRIMARY_METRICS[task]
        return cls(
            task=task,
            metric=metric,
            bound=getattr(evaluation, metric.bound_field.removeprefix("evaluation.")),
            baseline_tolerance=(
                evaluation.baseline_tolerance if evaluation.baseline == LATEST_BLESSED else None
            ),
        )

    @property
    def worst_change(self) -> float | None:
        """The smallest change (candidate - baseline) that passes, in the direction of better:
        ``-tolerance`` when higher is better, ``+tolerance`` when lower is better."""
        if self.baseline_tolerance is None:
            return None
        tolerance = self.baseline_tolerance
        return -tolerance if self.metric.higher_is_better else tolerance


def explain(
    rule: BlessingRule,
    *,
    candidate: float | None,
    baseline: float | None,
    missed_bound: bool,
    missed_baseline: bool,
    baseline_is_candidate: bool = False,
) -> str:
    """Why the new model was or was not blessed, in one sentence without its verdict ("its
    sparse_categorical_accuracy 0.9767 meets ...; the latest blessed model's is ..."), with both
    models' values.

    `candidate` and `baseline` are the primary metric of the new model and of the latest blessed
    model (None: there was none, or the comparison is off); `missed_bound` and `missed_baseline`
    say which of the Evaluator's thresholds failed. The verdict is the Evaluator's; this only
    puts its reasons into words."""
    name = rule.metric.key
    if candidate is None:
        return f"the Evaluator reported no {name} for the new model"
    relation = "misses" if missed_bound else "meets"
    reasons = [
        f"its {name} {candidate:.4f} {relation} {rule.metric.bound_field} "
        f"({rule.metric.bound_word} {rule.bound:g})"
    ]
    if rule.baseline_tolerance is None:
        reasons.append("it was not compared with an earlier model (evaluation.baseline: none)")
    elif baseline is None:
        reasons.append("no model of this pipeline was blessed before, so there was no baseline")
    elif baseline_is_candidate:
        reasons.append("it is itself the latest blessed model of this pipeline")
    else:
        better = "higher" if rule.metric.higher_is_better else "lower"
        worse_by = (
            (baseline - candidate) if rule.metric.higher_is_better else (candidate - baseline)
        )
        tolerance = f"evaluation.baseline_tolerance ({rule.baseline_tolerance:g})"
        if missed_baseline:
            comparison = (
                f"the new model is worse by {worse_by:.4f} ({better} is better), more than "
                f"{tolerance} allows"
            )
        elif worse_by > 0:
            comparison = f"the new model is worse by {worse_by:.4f}, within {tolerance}"
        else:
            comparison = "the new model is no worse"
        reasons.append(f"the latest blessed model's is {baseline:.4f}: {comparison}")
    return "; ".join(reasons)
