"""`fullthrottle run`: the whole pipeline on this machine."""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fullthrottle.commands.options import add_config_arguments, config_from_args
from fullthrottle.core import exit_status
from fullthrottle.core.config import Config
from fullthrottle.core.errors import USER_ERRORS, PipelineFailedError
from trainer_module.training import metrics

if TYPE_CHECKING:
    from fullthrottle.outcome import RunOutcome

LAST_RUN = "last_run.json"
INTERRUPTED = "interrupted"


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


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def run(args: argparse.Namespace) -> int:
    """Takes the output folder's lock, stages the data, runs the pipeline, and ends once: one read
    of ML Metadata, one `last_run.json`, tracking finished with the same summary. SIGINT and
    SIGTERM end it the same way, with status `interrupted` (exit 130 / 143)."""
    from fullthrottle.core.run_lock import hold_run_lock
    from trainer_module.training.interrupt import raising_on_signals

    config = config_from_args(args)
    command = resume_command(args)
    # At once, before any work: a second run on this folder is refused here.
    with hold_run_lock(config.output_path, command=command), raising_on_signals():
        return _run_locked(
            config,
            command=command,
            verbose=getattr(args, "verbose", False) or getattr(args, "debug", False),
        )


def resume_command(args: argparse.Namespace) -> str:
    """The command line that started this run (and resumes it) as the user typed it (behind
    `bin/envrun` or `make run`), secrets masked: it is printed, and written to the lock file and
    `last_run.json`."""
    from fullthrottle.core.launcher import command_as_typed
    from fullthrottle.core.redact import redact_text

    argv = getattr(args, "argv", None)
    if argv is None:
        argv = sys.argv[1:]
    return redact_text(command_as_typed(argv))


def _run_locked(config: Config, *, command: str, verbose: bool = False) -> int:
    from fullthrottle.core.disk import check_copies_folder, check_free_space, input_bytes
    from fullthrottle.core.staging import prepare_data

    # Bad data stops here, before any component runs, and before TFX, Beam and MLflow are
    # imported (seconds on a loaded machine).
    prepared = prepare_data(config)
    size = input_bytes(prepared.source_files)
    check_free_space(config.output_path, input_size=size)
    if config.training.input_snapshot_dir:
        check_copies_folder(
            config.training.input_snapshot_dir,
            input_size=size,
            setting="training.input_snapshot_dir",
        )

    from fullthrottle.core.native_logs import load_notes_dropped
    from fullthrottle.outcome import read_latest_run
    from fullthrottle.progress import PipelineProgress
    from fullthrottle.tracking import finish_tracking, start_tracking, tracking_message
    from pipelines.local_runner import run_local
    from pipelines.pipeline import code_fingerprint

    started_at = _now()
    print(
        f"fullthrottle: running pipeline {config.pipeline_name!r} on {', '.join(prepared.source_files)}"
        + (f" ({prepared.rows} rows)" if prepared.rows is not None else ""),
        file=sys.stderr,
    )
    if prepared.split is not None:
        print(f"fullthrottle: {prepared.split.describe()}", file=sys.stderr)
        rare = prepared.split.rare_classes_message()
        if rare:
            print(f"fullthrottle: {rare}", file=sys.stderr)
    tracker = None
    error: BaseException | None = None
    interrupted: KeyboardInterrupt | None = None
    try:
        # Tracking never stops the pipeline: its failures end up in the summary's `tracking`.
        tracker = start_tracking(
            config, source_files=prepared.source_files, code_fingerprint=code_fingerprint()
        )
        # Beam's SDK worker processes load TensorFlow themselves: their load notes are dropped
        # as this process's were (cli.quiet_third_party_logs).
        worker_processes = config.beam.direct_running_mode == "multi_processing"
        with (
            PipelineProgress(str(config.mlmd_path)),
            load_notes_dropped(enabled=worker_processes and not verbose),
        ):
            run_local(
                config,
                input_base=prepared.input_base,
                # The Trainer's link to the run travels in its custom_config.
                trainer_tracking=tracker.trainer_link().to_config() if tracker else None,
            )
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM (errors.Interrupted), anywhere in it
        interrupted = exc
    except Exception as exc:  # noqa: BLE001 - re-raised below with the failing component named
        error = exc
    outcome = read_latest_run(str(config.mlmd_path))
    summary = run_summary(
        config, outcome, started_at=started_at, error=interrupted or error, command=command
    )
    if prepared.split is not None:
        summary["split"] = prepared.split.to_dict()
    summary["tracking"] = finish_tracking(tracker, summary, outcome, error=interrupted or error)
    path = write_last_run(config, summary)
    if interrupted is not None:
        print(interrupted_message(summary, path), file=sys.stderr)
        # Everything is written. The interpreter's last garbage collection over TensorFlow's,
        # TFX's and Beam's objects took ~10 s here; a stopped run should end now, so that
        # collection is skipped (atexit handlers still run; the OS frees the memory).
        gc.freeze()
        return int(summary[INTERRUPTED]["exit_status"])
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
            f"{path}; rerun with --debug for the stack trace."
            + tracking_message(summary["tracking"], prefix=" ")
        ) from error
    print_summary(summary, path)
    if tracking_message(summary["tracking"]):
        print(tracking_message(summary["tracking"]), file=sys.stderr)
    if not summary["blessed"]:
        print(not_blessed_message(config, summary, path), file=sys.stderr)
        return exit_status.NOT_BLESSED
    return exit_status.SUCCESS


def interrupted_record(
    exc: BaseException, *, component: str | None, command: str
) -> dict[str, Any]:
    """`last_run.json`'s `interrupted`: the signal, where it landed, what was saved, how to
    resume, and the exit status."""
    from trainer_module.training.interrupt import signal_name

    signum = getattr(exc, "signum", signal.SIGINT)
    return {
        "signal": signal_name(signum),
        "exit_status": exit_status.interrupted(signum),
        "component": component,
        "step": getattr(exc, "step", None),
        "checkpoint": getattr(exc, "checkpoint", None),
        "resume_command": command,
    }


def interrupted_message(summary: dict[str, Any], path: Path) -> str:
    """One paragraph: where the run stopped, what was saved, the command that resumes it."""
    record = summary[INTERRUPTED]
    where = f"during {record['component']}" if record["component"] else "between components"
    if record["step"] is not None:
        total = (summary.get("config") or {}).get("training", {}).get("train_steps")
        where += f" at step {record['step']}" + (f" of {total}" if total else "")
    if record["checkpoint"]:
        saved = (
            f"The Trainer saved checkpoint {record['checkpoint']}; the rerun resumes training "
            f"from step {record['step']}."
        )
    else:
        saved = (
            "Completed components are kept in the cache; the rerun starts from where it stopped."
        )
    status = summary.get("tracking") or {}
    tracked = (
        f" MLflow run {status['run_id']} is marked KILLED; the rerun continues it."
        if status.get("run_id")
        else ""
    )
    return (
        f"fullthrottle run: interrupted by {record['signal']} {where}. {saved} Nothing was "
        f"pushed by this run.{tracked} Resume with: {record['resume_command']}  (details: {path})"
    )


def evaluation_record(
    config: Config, outcome: RunOutcome | None, *, blessed: bool
) -> dict[str, Any] | None:
    """`last_run.json`'s `evaluation`: the rule, both models' metrics (the new one and the latest
    blessed one it was compared with) and why the new one was or was not blessed."""
    from fullthrottle.core.evaluation import BlessingRule, explain

    evaluation = outcome.evaluation if outcome else None
    if evaluation is None:
        return None
    rule = BlessingRule.from_config(config)
    key = rule.metric.key
    baseline = evaluation.baseline
    return {
        "blessed": blessed,
        "reason": explain(
            rule,
            candidate=evaluation.candidate.metrics.get(key),
            baseline=baseline.metrics.get(key) if baseline else None,
            missed_bound=evaluation.missed("bound", key),
            missed_baseline=evaluation.missed("baseline", key),
            baseline_is_candidate=bool(
                baseline and baseline.model_id == evaluation.candidate.model_id
            ),
        ),
        "primary_metric": key,
        "higher_is_better": rule.metric.higher_is_better,
        "rule": {
            rule.metric.bound_field: rule.bound,
            "evaluation.baseline": config.evaluation.baseline,
            "evaluation.baseline_tolerance": config.evaluation.baseline_tolerance,
        },
        "candidate": evaluation.candidate.to_dict(),
        "baseline": baseline.to_dict() if baseline else None,
    }


def not_blessed_message(config: Config, summary: dict[str, Any], path: Path) -> str:
    """One paragraph for exit status 3: both models' primary metric and why, what is served,
    what to do."""
    from fullthrottle.core.evaluation import BlessingRule
    from serving.push import version_dirs

    rule = BlessingRule.from_config(config)
    record = summary.get("evaluation") or {}
    reason = record.get("reason") or "no evaluation was recorded"
    model_dir = config.serving_dir
    served = version_dirs(model_dir)
    still = (
        f"Serving is unchanged: version {max(served)} in {model_dir} is still the newest."
        if served
        else "Nothing was pushed before, so nothing is served yet."
    )
    return (
        f"fullthrottle run: the new model was not pushed because the Evaluator did not bless "
        f"it: {reason}. {still} To get a model pushed, train a better one (more steps, other "
        f"settings), or change the rule: {rule.metric.bound_field} is the bar on "
        f"{rule.metric.key}, evaluation.baseline_tolerance how much worse than the latest "
        f"blessed model it may be, evaluation.baseline=none turns the comparison off. Details: "
        f"{path}"
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or repr(error)
    return text.splitlines()[0][:500]


def run_summary(
    config: Config,
    outcome: RunOutcome | None,
    *,
    started_at: str,
    error: BaseException | None,
    command: str | None = None,
) -> dict[str, Any]:
    """What `last_run.json` says about a run, from its outcome in ML Metadata. Secrets (tokens,
    passwords, URL credentials in Beam args...) are masked: they never reach disk."""
    from fullthrottle.core.redact import redact, redact_text

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
        "evaluation": evaluation_record(
            config, outcome, blessed=bool(outcome and outcome.blessed and error is None)
        ),
        "training": outcome.training_summary if outcome else None,
        "components": components,
        "pipeline_root": str(config.pipeline_root),
        "mlmd_path": str(config.mlmd_path),
        "serving_dir": str(config.serving_dir),
        "started_at": started_at,
        "finished_at": _now(),
        "config": redact(config.to_dict()),
    }
    if isinstance(error, KeyboardInterrupt):
        summary["status"] = INTERRUPTED
        summary[INTERRUPTED] = interrupted_record(
            error, component=failed_component, command=command or ""
        )
    elif error is not None:
        summary["error"] = redact_text(f"{type(error).__name__}: {_first_line(error)}")
        summary["failed_component"] = failed_component
    return summary


def write_last_run(config: Config, summary: dict[str, Any]) -> Path:
    """Writes `<output_dir>/last_run.json` atomically (a reader never sees half a file)."""
    path = config.output_path / LAST_RUN
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)
    return path


def print_summary(summary: dict[str, Any], path: Path) -> None:
    lines = [
        f"fullthrottle: pipeline {summary['pipeline_name']!r} run {summary['run_id']} finished"
    ]
    width = max((len(name) for name in summary["components"]), default=0)
    for name, comp in summary["components"].items():
        lines.append(f"  {name:<{width}} {comp['state']:<9} {comp['seconds']:7.1f} s")
    candidate = summary["eval_metrics"]
    if candidate:
        shown = ", ".join(f"{k}={v:.4f}" for k, v in sorted(candidate.items()))
        lines.append(f"  evaluation: {shown}")
    evaluation = summary.get("evaluation") or {}
    baseline = evaluation.get("baseline")
    if baseline and baseline.get("metrics"):
        shown = ", ".join(f"{k}={v:.4f}" for k, v in sorted(baseline["metrics"].items()))
        pushed = (
            f" (pushed as version {baseline['pushed_version']})"
            if baseline.get("pushed_version")
            else ""
        )
        lines.append(f"  latest blessed model{pushed}: {shown}")
    if evaluation.get("reason"):
        verdict = "blessed" if evaluation.get("blessed") else "not blessed"
        lines.append(f"  {verdict}: {evaluation['reason']}")
    training = summary.get("training") or {}
    if training:
        steps = training.get(metrics.STEPS_COMPLETED)
        rate = float(training.get(metrics.EXAMPLES_PER_SECOND) or 0.0)
        wait = float(training.get(metrics.INPUT_WAIT_FRACTION) or 0.0)
        lines.append(
            f"  training: {steps} steps, {rate:.0f} examples/s, input wait {wait:.1%}, "
            f"{training.get(metrics.STRATEGY_NAME)}, {training.get(metrics.PRECISION_POLICY)}"
        )
        if training.get("advisor"):
            from trainer_module.training.advisor import format_advice

            lines.append("  step-time advisor:")
            lines.extend(format_advice(training["advisor"], indent="    "))
    split = summary.get("split") or {}
    if split:
        lines.append(
            f"  split: {split['method']}, {split['rows']['train']} train rows, "
            f"{split['rows']['eval']} eval rows"
        )
        if split.get("classes_not_evaluated"):
            from fullthrottle.core.splits import name_classes

            lines.append(
                "  trained on, never evaluated (too few rows for both splits): "
                + name_classes(split["classes_not_evaluated"])
            )
    if summary["pushed_model_dir"]:
        lines.append(f"  pushed: {summary['pushed_model_dir']}")
    elif summary["blessed"]:
        lines.append("  blessed, but the push was not recorded")
    else:
        lines.append("  NOT blessed by the Evaluator: nothing was pushed")
    lines.append(f"  details: {path}")
    print("\n".join(lines))
