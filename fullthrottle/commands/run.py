"""`fullthrottle run`: the whole pipeline on this machine."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sys
from typing import Any

from fullthrottle.core.config import PRESETS, Config, load_config
from fullthrottle.core.errors import USER_ERRORS, PipelineFailedError

LAST_RUN = "last_run.json"
EXIT_NOT_BLESSED = 3


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "run",
        help="run the whole pipeline locally (Beam DirectRunner, MLMD in SQLite)",
        description=(
            "Runs ExampleGen -> StatisticsGen -> SchemaGen -> ExampleValidator -> Transform -> "
            "Trainer -> Evaluator -> Pusher with LocalDagRunner. Without --config it trains on the "
            "bundled Palmer Penguins data. Writes <output_dir>/last_run.json."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle run\n"
            "  fullthrottle run --config my.yaml --set training.train_steps=200\n"
            "  fullthrottle run --set beam.direct_running_mode=multi_processing"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    return parser


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="a YAML config (see `fullthrottle init`)")
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), help="hardware preset applied before the file"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override one config field, e.g. training.train_steps=200 (repeatable)",
    )
    parser.add_argument(
        "--output-dir", help="where runs, metadata and pushed models go (default: runs/)"
    )
    parser.add_argument("--data", metavar="PATH", help="shorthand for --set data.path=PATH")


def config_from_args(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={json.dumps(args.output_dir)}")
    if args.data:
        overrides.append(f"data.path={json.dumps(args.data)}")
    return load_config(args.config, preset=args.preset, overrides=overrides)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def run(args: argparse.Namespace) -> int:
    from fullthrottle.core.staging import prepare_data

    config = config_from_args(args)
    prepared = prepare_data(config)  # bad data stops here, before any component runs
    started_at = _now()
    print(
        f"fullthrottle: running pipeline {config.pipeline_name!r} on {', '.join(prepared.source_files)}"
        + (f" ({prepared.rows} rows)" if prepared.rows is not None else ""),
        file=sys.stderr,
    )
    # --- tracking (issue 5): one MLflow run around the pipeline; never stops it -----------
    from fullthrottle.tracking import (
        finish_tracking,
        start_tracking,
        tracking_environment,
        tracking_message,
    )
    from pipelines.pipeline import code_fingerprint

    tracker = start_tracking(
        config, source_files=prepared.source_files, code_fingerprint=code_fingerprint()
    )
    # --- end tracking ----------------------------------------------------------------------
    error: BaseException | None = None
    try:
        from fullthrottle.progress import PipelineProgress
        from pipelines.local_runner import run_local

        # Component states and durations on stderr while the pipeline runs (issue 9).
        with PipelineProgress(str(config.mlmd_path)), tracking_environment(tracker):  # issue 5
            run_local(config, input_base=prepared.input_base)
    except Exception as exc:  # noqa: BLE001 - re-raised below with the failing component named
        error = exc
    summary = write_last_run(config, started_at=started_at, error=error)
    summary = finish_tracking(
        tracker, summary, error=error
    )  # issue 5: adds `tracking` to last_run.json
    if error is not None:
        failed = summary.get("failed_component") or "a component"
        # Our own errors already say what to do; anything else is shown with its type.
        cause = (
            str(error)
            if isinstance(error, USER_ERRORS)
            else f"{type(error).__name__}: {_first_line(error)}"
        )
        raise PipelineFailedError(
            f"{failed} failed: {cause} Nothing was pushed by this run. Details: "
            f"{config.output_path / LAST_RUN}; rerun with --debug for the stack trace."
            + tracking_message(summary, prefix=" ")  # issue 5
        ) from error
    print_summary(summary)
    if tracking_message(summary):  # issue 5
        print(tracking_message(summary), file=sys.stderr)
    return 0 if summary["blessed"] else EXIT_NOT_BLESSED


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or repr(error)
    return text.splitlines()[0][:500]


def write_last_run(
    config: Config, *, started_at: str, error: BaseException | None
) -> dict[str, Any]:
    from fullthrottle.core.redact import redact, redact_text  # issue 8
    from fullthrottle.outcome import read_latest_run

    outcome = read_latest_run(str(config.mlmd_path))
    components = {}
    failed_component = None
    if outcome is not None:
        for name, comp in outcome.components.items():
            components[name] = {
                "state": comp.state,
                "seconds": round(comp.seconds, 3),
                "execution_id": comp.execution_id,
            }
            if comp.state in ("failed", "running", "new") and error is not None:
                failed_component = name
    summary: dict[str, Any] = {
        "status": "failed" if error is not None else "succeeded",
        "pipeline_name": config.pipeline_name,
        "model_name": config.model_name,
        "run_id": outcome.run_id if outcome else None,
        "blessed": bool(outcome and outcome.blessed and error is None),
        "pushed_model_dir": outcome.pushed_model_dir if outcome and error is None else None,
        "pushed_version": outcome.pushed_version if outcome and error is None else None,
        "eval_metrics": outcome.eval_metrics if outcome else {},
        "training": outcome.training_summary if outcome else None,
        "components": components,
        "pipeline_root": str(config.pipeline_root),
        "mlmd_path": str(config.mlmd_path),
        "serving_dir": str(config.serving_dir),
        "started_at": started_at,
        "finished_at": _now(),
        # issue 8: secrets (tokens, passwords, URL credentials in Beam args...) never reach disk.
        "config": redact(dataclasses.asdict(config)),
    }
    if error is not None:
        summary["error"] = redact_text(f"{type(error).__name__}: {_first_line(error)}")  # issue 8
        summary["failed_component"] = failed_component
    path = config.output_path / LAST_RUN
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)
    summary["_path"] = str(path)
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    lines = [
        f"fullthrottle: pipeline {summary['pipeline_name']!r} run {summary['run_id']} finished"
    ]
    for name, comp in summary["components"].items():
        lines.append(f"  {name:<18} {comp['state']:<9} {comp['seconds']:7.1f} s")
    metrics = summary["eval_metrics"]
    if metrics:
        shown = ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))
        lines.append(f"  evaluation: {shown}")
    training = summary.get("training") or {}
    if training:
        lines.append(
            "  training: {steps} steps, {eps:.0f} examples/s, input wait {wait:.1%}, {strategy}, {precision}".format(
                steps=training.get("steps_completed"),
                eps=float(training.get("examples_per_second") or 0.0),
                wait=float(training.get("input_wait_fraction") or 0.0),
                strategy=training.get("strategy_name"),
                precision=training.get("precision_policy"),
            )
        )
        # --- step-time advisor (issue 4) ---------------------------------------------------------
        if training.get("advisor"):
            from trainer_module.training.advisor import format_advice

            lines.append("  step-time advisor:")
            lines.extend(format_advice(training["advisor"], indent="    "))
        # --- end advisor -------------------------------------------------------------------------
    if summary["pushed_model_dir"]:
        lines.append(f"  pushed: {summary['pushed_model_dir']}")
    elif summary["blessed"]:
        lines.append("  blessed, but the push was not recorded")
    else:
        lines.append("  NOT blessed by the Evaluator: nothing was pushed")
    lines.append(f"  details: {summary['_path']}")
    print("\n".join(lines))
