"""Progress you can watch: pipeline components as they run, and the Trainer's steps.

Two independent displays, both writing whole lines to stderr:

- `PipelineProgress`: a background thread that follows the newest pipeline run in the MLMD
  SQLite store `fullthrottle run` writes, and prints each component's state changes with its
  duration (``[pipeline] Transform complete 12.4 s``). It reads a byte copy of the store with
  ML Metadata's API (`fullthrottle.outcome`), never the store itself: a plain file read takes no
  SQLite lock, so nothing it does can make the pipeline's own writes wait or fail.
- `TrainerProgress`: a `TrainingHook` showing step, loss, examples/s and ETA. On a terminal it
  redraws one line (a bar); otherwise (CI, logs, pipes) it prints plain lines with no control
  characters, at most one per `plain_interval_seconds`, plus the first and last loop.

Neither display ever stops the work it watches: a failed poll is skipped, not raised.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, TextIO

from fullthrottle.outcome import latest_run, open_store, run_executions
from trainer_module.training import RunFacts, TrainingHook, metrics

_FINAL_STATES = {"complete", "failed", "cached", "canceled"}
# Erase the current terminal line before writing a full one (TTY only), so a line printed while
# the trainer's bar is showing does not end up glued to the bar.
_CLEAR_LINE = "\r\x1b[K"


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed stream
        return False


def _format_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


# --- pipeline components, from ML Metadata ------------------------------------------------------
@dataclass(frozen=True)
class ComponentState:
    component: str
    state: str
    seconds: float


def read_component_states(mlmd_path: str, *, since_ms: int) -> list[ComponentState] | None:
    """Component states of the newest pipeline run created at or after `since_ms`.

    Returns None when there is no such run yet, or when the copy could not be read (a copy taken
    while the pipeline was writing: the next poll takes another). Reads a byte copy of the SQLite
    file through ML Metadata's API, never the live store: SQLite's readers take a shared lock,
    and a writer that meets one waits or fails with "database is locked"; copying the file is a
    plain read, which takes no SQLite lock at all.
    """
    if not os.path.exists(mlmd_path):
        return None
    with tempfile.TemporaryDirectory(prefix="fullthrottle-progress-") as tmp:
        copy = os.path.join(tmp, "mlmd.sqlite")
        store = None
        try:
            shutil.copyfile(mlmd_path, copy)
            store = open_store(copy, read_only=True)
            run = latest_run(store, since_ms=since_ms)
            executions = run_executions(store, run) if run is not None else None
        except Exception:  # noqa: BLE001 - a torn copy or a store mid-migration: skip this poll
            return None
        finally:
            del store  # closes the connection before the copy is deleted
    if executions is None:
        return None
    return [
        ComponentState(component=e.component, state=e.state, seconds=e.seconds) for e in executions
    ]


class PipelineProgress:
    """Prints component state changes of the run in progress; use as a context manager.

    Owns one daemon thread, started by `__enter__` and joined by `__exit__` (which also prints
    whatever changed since the last poll, so the final states are always shown).
    """

    def __init__(
        self,
        mlmd_path: str,
        *,
        stream: TextIO | None = None,
        poll_seconds: float = 1.0,
        heartbeat_seconds: float = 60.0,
    ) -> None:
        self._mlmd_path = str(mlmd_path)
        self._stream = stream or sys.stderr
        self._poll_seconds = poll_seconds
        self._heartbeat_seconds = heartbeat_seconds
        self._terminal = _is_terminal(self._stream)
        self._since_ms = 0
        self._seen: dict[str, str] = {}
        self._running_since: dict[str, float] = {}
        self._last_heartbeat: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PipelineProgress:
        # MLMD times are wall-clock milliseconds; a second of slack for clock granularity.
        self._since_ms = int(time.time() * 1000) - 1000
        self._thread = threading.Thread(
            target=self._loop, name="fullthrottle-progress", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.poll()

    def _loop(self) -> None:
        while not self._stop.wait(self._poll_seconds):
            self.poll()

    def _write(self, line: str) -> None:
        prefix = _CLEAR_LINE if self._terminal else ""
        with contextlib.suppress(ValueError, OSError):  # a closed stream must not stop the run
            self._stream.write(f"{prefix}[pipeline] {line}\n")
            self._stream.flush()

    def poll(self) -> None:
        """One look at the store; prints what changed. Never raises on a bad read."""
        states = read_component_states(self._mlmd_path, since_ms=self._since_ms)
        now = time.monotonic()
        for component in states or ():
            name, state = component.component, component.state
            if self._seen.get(name) == state:
                if (
                    state == "running"
                    and now - self._last_heartbeat.get(name, now) >= self._heartbeat_seconds
                ):
                    elapsed = now - self._running_since.get(name, now)
                    self._write(f"{name} still running ({_format_seconds(elapsed)})")
                    self._last_heartbeat[name] = now
                continue
            self._seen[name] = state
            if state in _FINAL_STATES:
                self._write(f"{name:<18} {state:<9} {component.seconds:7.1f} s")
            else:
                self._running_since.setdefault(name, now)
                self._last_heartbeat[name] = now
                self._write(f"{name:<18} {state}")

    @property
    def seen(self) -> dict[str, str]:
        """Component -> last state printed (for tests and summaries)."""
        return dict(self._seen)


# --- the trainer -------------------------------------------------------------------------------
class TrainerProgress(TrainingHook):
    """Step, loss, examples/s and ETA of the running Trainer.

    On a terminal: one line redrawn after every loop (a bar). Otherwise: plain lines, no control
    characters, at most one per `plain_interval_seconds` (the first and the last loop always).
    Throughput and ETA use the loops after the first one (which includes tracing) when there are
    any.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        terminal: bool | None = None,
        plain_interval_seconds: float = 10.0,
        bar_width: int = 24,
    ) -> None:
        self._stream = stream or sys.stderr
        self._terminal = _is_terminal(self._stream) if terminal is None else terminal
        self._plain_interval = plain_interval_seconds
        self._bar_width = bar_width
        self._total = 0
        self._start_step = 0
        self._started = 0.0
        self._last_plain = -float("inf")
        self._loops: list[tuple[int, float]] = []  # (steps, seconds) per loop
        self._examples_per_second = 0.0
        self._bar_showing = False

    def _emit(self, text: str, *, redraw: bool = False) -> None:
        with contextlib.suppress(ValueError, OSError):
            if self._terminal:
                self._stream.write(_CLEAR_LINE + text + ("" if redraw else "\n"))
                self._bar_showing = redraw
            else:
                self._stream.write(text + "\n")
            self._stream.flush()

    def on_train_begin(self, facts: RunFacts) -> None:
        self._total = facts.train_steps
        self._start_step = facts.start_step
        self._started = time.monotonic()
        resumed = f" (resumed from step {self._start_step})" if self._start_step else ""
        self._emit(
            f"[trainer] start step {self._start_step}/{self._total}{resumed}: "
            f"{facts.model_kind} model, {facts.parameters} parameters, "
            f"{facts.strategy_name} x{facts.num_replicas}, "
            f"global batch {facts.global_batch_size}, {facts.precision_policy}"
        )
        for prefix in facts.unreadable_checkpoints:
            self._emit(
                f"[trainer] warning: checkpoint {prefix} is unreadable (damaged or cut short); "
                "moved to checkpoints/unreadable/, resumed from the newest readable one"
            )

    def _steady_rate(self) -> float | None:
        """Seconds per step, from the loops after the first (tracing) one when there are any."""
        loops = self._loops[1:] if len(self._loops) > 1 else self._loops
        steps = sum(n for n, _ in loops)
        seconds = sum(s for _, s in loops)
        return seconds / steps if steps else None

    def on_loop_end(self, step: int, record: dict) -> None:
        steps = int(record.get(metrics.STEPS) or 0)
        wall = float(record.get(metrics.WALL_TIME) or 0.0)
        if steps:
            self._loops.append((steps, wall))
        seconds_per_step = self._steady_rate()
        eta = (self._total - step) * seconds_per_step if seconds_per_step is not None else None
        self._examples_per_second = float(record.get(metrics.EXAMPLES_PER_SECOND) or 0.0)
        loss = record.get(metrics.LOSS)
        loss_text = f"{float(loss):.4f}" if loss is not None else "-"
        fraction = step / self._total if self._total else 1.0
        eta_text = _format_seconds(eta) if eta is not None else "?"
        wait = record.get(metrics.INPUT_WAIT_FRACTION)
        wait_text = f" input_wait={float(wait):.0%}" if wait is not None else ""
        if self._terminal:
            filled = int(round(fraction * self._bar_width))
            bar = "#" * filled + "-" * (self._bar_width - filled)
            self._emit(
                f"[trainer] [{bar}] {step}/{self._total} loss {loss_text} "
                f"{self._examples_per_second:,.0f} ex/s ETA {eta_text}",
                redraw=step < self._total,
            )
            return
        now = time.monotonic()
        first = len(self._loops) <= 1
        last = step >= self._total
        if not (first or last or now - self._last_plain >= self._plain_interval):
            return
        self._last_plain = now
        self._emit(
            f"[trainer] step {step}/{self._total} ({fraction:.0%}) loss={loss_text} "
            f"examples/s={self._examples_per_second:.0f}{wait_text} eta={eta_text}"
        )

    def on_interrupt(self, step: int, checkpoint: str | None) -> None:
        saved = f", checkpoint {checkpoint} written" if checkpoint else ""
        self._emit(f"[trainer] stopped at step {step}/{self._total} on a signal{saved}")

    def on_train_end(self, result: Any) -> None:
        if self._bar_showing:
            self._emit("")  # end the bar's line
        elapsed = time.monotonic() - self._started
        evaluated = result.eval_metrics or {}
        accuracy = evaluated.get(metrics.EVAL_ACCURACY)
        accuracy_text = f", eval accuracy {accuracy:.4f}" if accuracy is not None else ""
        if metrics.EVAL_MAE in evaluated:  # a regression model
            accuracy_text = (
                f", eval MAE {evaluated[metrics.EVAL_MAE]:.4g} "
                f"RMSE {evaluated[metrics.EVAL_RMSE]:.4g}"
            )
        self._emit(
            f"[trainer] done: {result.steps_completed} steps in {_format_seconds(elapsed)}, "
            f"examples/s={result.examples_per_second:.0f} (steady state), "
            f"input_wait={result.input_wait_fraction:.0%}{accuracy_text}"
        )
