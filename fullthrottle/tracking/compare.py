"""Comparing tracked runs: which params differ, what came out, and the curves side by side.

Owns reading pipeline runs back from MLflow (the parent runs `fullthrottle run` creates, and
their Trainer runs' metric histories), the terminal table, and the chart (PNG, matplotlib).
Refuses: fewer than one run, unknown run ids, a store without fullthrottle runs; each with a
message saying where it looked and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fullthrottle.core.errors import FullthrottleError
from fullthrottle.core.evaluation import CLASSIFICATION, PRIMARY_METRICS, REGRESSION
from fullthrottle.tracking.names import COMPONENT_TAG, EVALUATOR_GROUP, RUN_KEY_TAG, metric_name
from trainer_module.training import metrics

RESULTS = (
    (
        "accuracy",
        (
            metric_name(EVALUATOR_GROUP, PRIMARY_METRICS[CLASSIFICATION].key),
            metrics.eval_chart_name(metrics.EVAL_ACCURACY),
        ),
        "{:.4f}",
    ),
    # Regression runs (shown when a run has them).
    (
        "MAE",
        (
            metric_name(EVALUATOR_GROUP, PRIMARY_METRICS[REGRESSION].key),
            metrics.eval_chart_name(metrics.EVAL_MAE),
        ),
        "{:.4g}",
    ),
    (
        "RMSE",
        (
            metric_name(EVALUATOR_GROUP, "root_mean_squared_error"),
            metrics.eval_chart_name(metrics.EVAL_RMSE),
        ),
        "{:.4g}",
    ),
    ("loss", (metrics.chart_name(metrics.FINAL_LOSS),), "{:.4f}"),
    ("examples/s", (metrics.chart_name(metrics.EXAMPLES_PER_SECOND),), "{:,.0f}"),
    ("input-bound %", (metrics.chart_name(metrics.INPUT_WAIT_FRACTION),), "{:.1%}"),
)
# Rows left out of the table when no run has a value (a regression model's errors).
OPTIONAL_RESULTS = ("MAE", "RMSE")
# The Trainer run's curves drawn side by side: loss and throughput against the step.
CURVES = (metrics.LOSS, metrics.EXAMPLES_PER_SECOND)


class CompareError(FullthrottleError):
    """The runs to compare cannot be found."""


@dataclass
class RunView:
    run_id: str
    name: str
    status: str
    params: dict[str, str]
    metrics: dict[str, float]
    wall_seconds: float | None
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.run_id[:8]})"


def find_runs(client: Any, *, experiment: str, run_ids: list[str], last: int) -> list[RunView]:
    """The named runs, or the `last` newest pipeline runs of `experiment`, oldest first."""
    from mlflow.exceptions import MlflowException

    if run_ids:
        runs = []
        for run_id in run_ids:
            try:
                runs.append(client.get_run(run_id))
            except MlflowException:
                raise CompareError(
                    f"run {run_id!r} is not in the tracking store {client.tracking_uri}; list runs with "
                    "`fullthrottle compare --last 10` or `fullthrottle ui`"
                ) from None
    else:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise CompareError(
                f"no experiment {experiment!r} in the tracking store {client.tracking_uri}; run "
                "`fullthrottle run` first, or point --output-dir / --tracking-uri / --experiment at the runs"
            )
        runs = client.search_runs(
            [found.experiment_id],
            filter_string=f"tags.`{RUN_KEY_TAG}` != ''",
            order_by=["attributes.start_time DESC"],
            max_results=last,
        )
        if not runs:
            raise CompareError(
                f"experiment {experiment!r} in {client.tracking_uri} has no fullthrottle pipeline runs yet"
            )
        runs = list(reversed(runs))
    views = []
    for run in runs:
        end = run.info.end_time
        views.append(
            RunView(
                run_id=run.info.run_id,
                name=run.info.run_name or run.info.run_id[:8],
                status=run.info.status,
                params=dict(run.data.params),
                metrics=dict(run.data.metrics),
                wall_seconds=(end - run.info.start_time) / 1000.0 if end else None,
                curves=_trainer_curves(client, run),
            )
        )
    return views


def _trainer_curves(client: Any, run: Any) -> dict[str, list[tuple[int, float]]]:
    children = client.search_runs(
        [run.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{run.info.run_id}' and tags.`{COMPONENT_TAG}` = 'Trainer'",
    )
    curves: dict[str, list[tuple[int, float]]] = {}
    for child in children[:1]:
        for key in CURVES:
            history = client.get_metric_history(child.info.run_id, metrics.chart_name(key))
            curves[key] = sorted((m.step, m.value) for m in history)
    return curves


def differing_params(runs: list[RunView]) -> list[str]:
    keys = sorted({k for r in runs for k in r.params})
    return [k for k in keys if len({r.params.get(k) for r in runs}) > 1]


def _result(run: RunView, keys: tuple[str, ...]) -> float | None:
    for key in keys:
        if key in run.metrics:
            return run.metrics[key]
    return None


def table(runs: list[RunView]) -> str:
    """A plain-text table: one column per run; differing params, then key results."""
    header = ["", *(r.label for r in runs)]
    rows: list[list[str]] = [["status", *(r.status for r in runs)]]
    differing = differing_params(runs)
    for key in differing:
        rows.append([key, *(r.params.get(key, "-") for r in runs)])
    if not differing and len(runs) > 1:
        rows.append(["(params)", *("identical" for _ in runs)])
    rows.append(["-" * 3, *("" for _ in runs)])
    for name, keys, fmt in RESULTS:
        values = [_result(r, keys) for r in runs]
        if name in OPTIONAL_RESULTS and all(v is None for v in values):
            continue
        rows.append([name, *("-" if v is None else fmt.format(v) for v in values)])
    rows.append(
        ["wall time", *("-" if r.wall_seconds is None else f"{r.wall_seconds:.1f} s" for r in runs)]
    )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("  ".join("=" * w for w in widths))
    for row in rows:
        if row[0] == "---":
            lines.append("  ".join("-" * w for w in widths))
        else:
            lines.append(
                "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            )
    return "\n".join(lines)


def chart(runs: list[RunView], path: Path) -> Path:
    """Loss and throughput (examples/s) against the training step, one line per run (PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, (loss_axes, speed_axes) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in runs:
        for axes, key in zip((loss_axes, speed_axes), CURVES, strict=True):
            points = run.curves.get(key) or []
            if points:
                steps, values = zip(*points, strict=True)
                axes.plot(steps, values, marker=".", label=run.label)
    loss_axes.set(title="training loss", xlabel="step", ylabel="loss")
    speed_axes.set(title="throughput", xlabel="step", ylabel="examples / s")
    for axes in (loss_axes, speed_axes):
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
