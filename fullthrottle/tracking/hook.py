"""The Trainer's MLflow hook: training metrics, exactly once, without slowing training down.

Owns the Trainer's nested MLflow run: derived params (replicas, global batch, precision policy,
scaled learning rate), per-loop metrics with their step (``train/loss``, ``train/learning_rate``,
``train/examples_per_second``, ``train/input_wait_fraction``, ``train/loss_scale``,
``train/step_time``), system metrics (MLflow's own: CPU, memory, disk, network, GPU when
present), eval metrics at the end.
Runs on the chief only (the training library calls hooks there only).

Where: the link (`store.TrainerLink`, from the Trainer's custom_config) names the destination, the
experiment and the pipeline key. The parent run is the newest unfinished run of the experiment
with that key (`fullthrottle run` made it before the pipeline started); when there is none (on
Kubeflow, where nothing runs before the pipeline), the hook makes the parent itself, with the
Trainer's params and the source tags, and ends it when training ends. A Trainer pod that is
killed and retried finds that parent again, still unfinished.

Points, not loops: about `points_per_curve` (100) points per curve, so runs of any length
compare on the same footing. The run's steps are cut into `points_per_curve` equal spans
(train_steps / points_per_curve, rounded up); consecutive loops are aggregated into one point at
the first loop end in each span (loss weighted by steps, rates and fractions by time, step time
= time / steps, learning rate and loss scale the last loop's); when loops are longer than a span,
every loop is a point. A fast tabular run (~60 loops/s on 2 cores) with a point per loop wrote
~200k points per metric per hour, and the store's per-point cost took 2-4% of its examples/s.

Exactly once across a kill and resume:
- every loop's record, and every point made from loops, is appended to a journal in the
  training's work dir (the folder that holds the checkpoints and survives a killed run), before
  anything is sent;
- points are handed to the background sender only when a checkpoint covering their step has
  been written (`on_checkpoint`), so MLflow never sees a step that a resume will train again;
- on resume from step S, journaled points with step <= S that MLflow does not have yet (the
  process died before they were sent) are sent, and the journaled loops after the last such point
  (up to S) become one point at their last step; everything after S is dropped (it is retrained).
So each loop is counted in exactly one point, and every loop up to the last checkpoint is there.
A resume from behind what MLflow already has (the newest checkpoint was unreadable and set aside)
trains those steps again but sends points only past the newest step MLflow has: no step twice;
the curve keeps the first training's values there.
A signal that stops training (`on_interrupt`) sends what its checkpoint covers and marks the
Trainer run KILLED; the rerun re-attaches it, as after a kill.
On an object store (gs://, which cannot append) the journal is rewritten at each checkpoint
instead of appended per loop: a kill between a checkpoint and that rewrite loses the points of
the loops since the previous checkpoint (a gap in the curve, never a duplicate).

The nested run is found again by its parent run id and the training key (the work dir's name,
derived from inputs, transform graph, training config and code), never created twice.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from mlflow.entities import Metric, Param, RunTag

from fullthrottle.core.redact import redact_value
from fullthrottle.tracking.channel import Channel, MetricSender
from fullthrottle.tracking.names import (
    ATTACHED_AT_TAG,
    COMPONENT_TAG,
    CREATED_BY_TAG,
    INTERRUPTED_AT_TAG,
    PIPELINE_KEY_TAG,
    PIPELINE_TAG,
    TRACKING_GROUP,
    TRAINING_KEY_TAG,
    UNREADABLE_CHECKPOINTS_TAG,
    metric_name,
)
from fullthrottle.tracking.store import TrainerLink, bound_http_requests, scoped_tracking_uri
from trainer_module.training import RunFacts, TrainingHook, hardware, metrics

_log = logging.getLogger("fullthrottle.tracking")

JOURNAL = "mlflow_journal.jsonl"
CREATED_BY_TRAINER = "Trainer"
GPU_METRICS_TAG = "fullthrottle.gpu_metrics"


def _now_ms() -> int:
    return int(time.time() * 1000)


class CpuMeter:
    """CPU seconds that tracking itself spends, per part: the hook's work on the training thread
    between loops ("hook"), the background sender's requests ("sender"), and MLflow's
    system-metrics thread ("system", read from that thread's CPU clock at each loop's end). Each
    part is added to by one thread only (thread CPU time, `time.thread_time`), so no lock is
    needed. `span()` is what was spent between the first and the last loop's end,
    the window the benchmark's examples/s cover.

    The hook's wall time is kept too ("hook_wall"): training waits for the hook whatever it does,
    CPU or I/O, so the hook's wall time plus the other threads' CPU is tracking's direct cost
    (`direct_fraction`); the CPU-only `fraction` misses a hook that blocks on I/O.
    """

    PARTS = ("hook", "sender", "system", "hook_wall")
    CPU_PARTS = ("hook", "sender", "system")

    def __init__(self) -> None:
        self.totals = dict.fromkeys(self.PARTS, 0.0)
        self._first: tuple[float, dict[str, float]] | None = None
        self._last: tuple[float, dict[str, float]] | None = None

    def add(self, part: str, seconds: float) -> None:
        self.totals[part] += seconds

    @contextmanager
    def measuring(self, part: str) -> Iterator[None]:
        """Adds the calling thread's CPU time inside the block to `part` (and, for the hook,
        the block's wall time to "hook_wall")."""
        wall_started = time.perf_counter()
        started = time.thread_time()
        try:
            yield
        finally:
            self.add(part, time.thread_time() - started)
            if part == "hook":
                self.add("hook_wall", time.perf_counter() - wall_started)

    def mark_loop_end(self) -> None:
        mark = (time.perf_counter(), dict(self.totals))
        if self._first is None:
            self._first = mark
        self._last = mark

    def span(self) -> dict[str, float] | None:
        """CPU seconds per part and their share of the wall time between the first and the last
        loop's end (`fraction`), the hook's wall seconds, and the direct cost's share
        (`direct_fraction`: hook wall + sender and system CPU); None before two loops ended."""
        if self._first is None or self._last is None or self._last[0] <= self._first[0]:
            return None
        wall = self._last[0] - self._first[0]
        parts = {k: self._last[1][k] - self._first[1][k] for k in self.PARTS}
        return {
            **parts,
            "wall_seconds": wall,
            "fraction": sum(parts[k] for k in self.CPU_PARTS) / wall,
            "direct_fraction": (parts["hook_wall"] + parts["sender"] + parts["system"]) / wall,
        }


class Journal:
    """Loop records beside the checkpoints, one JSON line each.

    On a local disk each record is appended and flushed at once (an OS write, not an fsync: a
    killed process loses nothing the OS has, which is what resume needs). On an object store
    (``gs://``; no appends there) the records are kept in memory and the whole journal is
    rewritten by `persist`, which the hook calls at each checkpoint before releasing points.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.remote = "://" in path
        self._file: Any = None
        self._records: list[dict[str, Any]] = []  # an object store's journal, in memory

    def read(self) -> list[dict[str, Any]]:
        import tensorflow as tf

        if not tf.io.gfile.exists(self.path):
            return []
        records = []
        with tf.io.gfile.GFile(self.path, "r") as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # a torn last line from a killed process
        return records

    def keep_until(self, step: int) -> list[dict[str, Any]]:
        """Rewrites the journal with the records at or before `step`; returns them."""
        kept = [r for r in self.read() if r["step"] <= step]
        self._rewrite(kept)
        if self.remote:
            self._records = list(kept)
        return kept

    def _rewrite(self, records: list[dict[str, Any]]) -> None:
        import tensorflow as tf

        tmp = self.path + ".tmp"
        with tf.io.gfile.GFile(tmp, "w") as f:
            f.write("".join(json.dumps(record) + "\n" for record in records))
        tf.io.gfile.rename(tmp, self.path, overwrite=True)

    def append(self, record: dict[str, Any]) -> None:
        if self.remote:
            self._records.append(record)
            return
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open across loops
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def persist(self) -> None:
        """Makes every appended record durable (a no-op on a local disk: already written)."""
        if self.remote:
            self._rewrite(self._records)

    def close(self) -> None:
        self.persist()
        if self._file is not None:
            self._file.close()
            self._file = None


def _metrics_of(record: dict[str, Any]) -> list[Metric]:
    return [
        Metric(
            key=metrics.chart_name(key),
            value=float(value),
            timestamp=record["timestamp"],
            step=record["step"],
        )
        for key, value in record["values"].items()
    ]


# How loops combine into one point (see the module docstring); other keys keep the last value.
_STEP_WEIGHTED = (metrics.LOSS,)
_TIME_WEIGHTED = (metrics.EXAMPLES_PER_SECOND, metrics.INPUT_WAIT_FRACTION)


def aggregate_loops(loops: list[dict[str, Any]]) -> dict[str, Any]:
    """One point from consecutive loop records (``kind`` "loop": step, timestamp, values, steps,
    wall_time), at the last loop's step and time."""
    last = loops[-1]
    steps = sum(r["steps"] for r in loops)
    wall = sum(r["wall_time"] for r in loops)
    values: dict[str, float] = {}
    for key in last["values"]:
        having = [r for r in loops if key in r["values"]]
        if key in _STEP_WEIGHTED and steps > 0:
            values[key] = sum(r["values"][key] * r["steps"] for r in having) / sum(
                r["steps"] for r in having
            )
        elif key in _TIME_WEIGHTED and wall > 0:
            values[key] = sum(r["values"][key] * r["wall_time"] for r in having) / sum(
                r["wall_time"] for r in having
            )
        elif key == metrics.STEP_TIME and steps > 0 and len(having) == len(loops):
            values[key] = wall / steps
        else:
            values[key] = last["values"][key]
    return {
        "kind": "point",
        "step": last["step"],
        "timestamp": last["timestamp"],
        "values": values,
        "loops": len(loops),
    }


def _is_point(record: dict[str, Any]) -> bool:
    return record.get("kind", "point") == "point"  # journals before loop records: all points


class SystemMetrics:
    """CPU, memory, disk, network (and GPU when an NVIDIA driver answers) of the Trainer's
    machine, sampled by MLflow's own system-metrics logging every `interval` seconds into the
    Trainer run, started through MLflow's public API (`mlflow.start_run(...,
    log_system_metrics=True)` on the existing run, `mlflow.set_system_metrics_sampling_interval`)
    and ended with `mlflow.end_run`. Its points carry MLflow's own sample count as their step
    (MLflow numbers them itself), not the training step."""

    def __init__(self, *, uri: str, run_id: str, interval: float) -> None:
        import mlflow

        self._uri, self._run_id = uri, run_id
        nvml = hardware.nvml_facts()  # what MLflow's GPU monitor will find (it asks NVML too)
        if nvml.gpus:
            self.gpu_metrics = f"{len(nvml.gpus)} GPU(s): utilization, memory used, power"
        else:
            self.gpu_metrics = f"unavailable: {nvml.error or 'NVML sees no GPU'}"
        self.has_gpu = bool(nvml.gpus)
        mlflow.set_system_metrics_sampling_interval(interval)
        mlflow.set_system_metrics_samples_before_logging(1)
        before = {thread.ident for thread in threading.enumerate()}
        # The sampler keeps the URI it starts with; the process-wide URI is restored after.
        with scoped_tracking_uri(uri):
            mlflow.start_run(run_id=run_id, log_system_metrics=True)
        # MLflow samples on a thread of its own: its CPU time is tracking's "system" part.
        started = [t for t in threading.enumerate() if t.ident not in before]
        self._clock = None
        if started and started[0].ident is not None:
            with contextlib.suppress(OSError):
                self._clock = time.pthread_getcpuclockid(started[0].ident)
        self._cpu_seconds = 0.0

    def cpu_seconds(self) -> float:
        """CPU seconds MLflow's sampling thread has used so far (the last reading once it ended)."""
        if self._clock is not None:
            try:
                self._cpu_seconds = time.clock_gettime(self._clock)
            except OSError:  # the thread has ended
                self._clock = None
        return self._cpu_seconds

    def stop(self, status: str) -> None:
        """Ends the sampling (one last sample is logged) and leaves the run `status`."""
        import mlflow

        with scoped_tracking_uri(self._uri):
            mlflow.end_run(status=status)


class MlflowTrainingHook(TrainingHook):
    """Tracks one training run into a nested MLflow run under the pipeline's run."""

    def __init__(self, link: TrainerLink, *, run_params: Mapping[str, str] | None = None) -> None:
        self.link = link
        self.run_params = dict(run_params or {})
        self.channel = Channel(
            link.uri, retries=link.retries, backoff_seconds=link.retry_backoff_seconds
        )
        self.sender: MetricSender | None = None
        self.experiment_id: str | None = link.experiment_id
        self.parent_run_id: str | None = link.parent_run_id
        self.owns_parent = False  # this hook made the parent run (no `fullthrottle run` around it)
        self.run_id: str | None = None
        self.journal: Journal | None = None
        self._pending: list[dict[str, Any]] = []  # points not yet covered by a checkpoint
        self._sent_through = -1  # on a resume: the newest step MLflow already had
        self._loops: list[dict[str, Any]] = []  # loops since the last point
        self._steps_per_point = 0  # set from the run's train_steps; 0 = a point per loop
        self._next_point_step = 0  # the loop ending at or after this step closes a point
        self._step = 0
        self._sampler: SystemMetrics | None = None
        self.cpu = CpuMeter()  # tracking's own CPU time (see `CpuMeter`)

    # --- TrainingHook ---------------------------------------------------------------------
    def on_train_begin(self, facts: RunFacts) -> None:
        bound_http_requests(self.link.request_timeout_seconds)
        work_dir = facts.work_dir
        start_step = facts.start_step
        self._step = start_step
        points = max(0, int(self.link.points_per_curve))
        self._steps_per_point = math.ceil(facts.train_steps / points) if points else 0
        self._next_point_step = self._span_end_after(start_step)
        if "://" not in work_dir:
            os.makedirs(work_dir, exist_ok=True)
        self.journal = Journal(os.path.join(work_dir, JOURNAL))
        self.sender = MetricSender(
            self.channel,
            interval_seconds=self.link.metrics_interval_seconds,
            on_request_cpu=lambda seconds: self.cpu.add("sender", seconds),
        )
        if self.parent_run_id is None:
            self._attach_parent()
        if self.parent_run_id is not None:
            self.run_id = self._attach_run(training_key=os.path.basename(work_dir.rstrip("/")))
        kept = self.journal.keep_until(start_step)
        points_kept = [r for r in kept if _is_point(r)]
        last_point = points_kept[-1]["step"] if points_kept else -1
        unpointed = [r for r in kept if not _is_point(r) and r["step"] > last_point]
        if unpointed:  # trained and checkpointed, but the process died before their point
            point = aggregate_loops(unpointed)
            self.journal.append(point)
            self.journal.persist()
            points_kept.append(point)
        if self.run_id is not None:
            self.channel.ok(
                "mark the Trainer run running",
                self.channel.client.update_run,
                self.run_id,
                status="RUNNING",
            )
            if start_step > 0:
                self._resend_missing(points_kept)
            self._log_derived(facts)
            if self.link.system_metrics_interval_seconds > 0:
                try:
                    self._sampler = SystemMetrics(
                        uri=self.link.uri,
                        run_id=self.run_id,
                        interval=self.link.system_metrics_interval_seconds,
                    )
                except Exception as exc:  # noqa: BLE001 - no system metrics; training goes on
                    self.channel.record_failure(f"start MLflow's system metrics: {exc}")
            self._say_gpu_metrics()
        self._write_status()

    def on_loop_end(self, step: int, record: dict[str, Any]) -> None:
        with self.cpu.measuring("hook"):
            self._on_loop_end(step, record)
        if self._sampler is not None:
            self.cpu.totals["system"] = self._sampler.cpu_seconds()
        self.cpu.mark_loop_end()

    def _on_loop_end(self, step: int, record: dict[str, Any]) -> None:
        values = {k: float(record[k]) for k in metrics.LOOP_SCALARS if record.get(k) is not None}
        self._step = int(step)
        if self._steps_per_point <= 1:  # every loop is a point
            self._add_point(
                {"kind": "point", "step": int(step), "timestamp": _now_ms(), "values": values}
            )
            return
        loop = {
            "kind": "loop",
            "step": int(step),
            "timestamp": _now_ms(),
            "values": values,
            "steps": int(record.get(metrics.STEPS) or 0),
            "wall_time": float(record.get(metrics.WALL_TIME) or 0.0),
        }
        if self.journal is not None:
            self.journal.append(loop)
        self._loops.append(loop)
        # A loop without its step count (a caller other than the controller) gets its own point.
        if loop["steps"] <= 0 or loop["step"] >= self._next_point_step:
            self._close_point()
            self._next_point_step = self._span_end_after(loop["step"])

    def _span_end_after(self, step: int) -> int:
        """The end of the span of steps that `step` is followed by (the points' grid)."""
        if self._steps_per_point <= 1:
            return step + 1
        return (step // self._steps_per_point + 1) * self._steps_per_point

    def _close_point(self) -> None:
        if self._loops:
            self._add_point(aggregate_loops(self._loops))
            self._loops = []

    def _add_point(self, point: dict[str, Any]) -> None:
        if self.journal is not None:
            self.journal.append(point)
        self._pending.append(point)

    def on_checkpoint(self, step: int, path: str) -> None:
        """Releases the records this checkpoint covers: a resume will never train them again."""
        with self.cpu.measuring("hook"):
            if self.journal is not None:
                self.journal.persist()
            self._release(until_step=step)

    def on_interrupt(self, step: int, checkpoint: str | None) -> None:
        """A signal stopped training at ``step`` with a checkpoint there: sends what it covers and
        marks the Trainer run KILLED (the rerun's hook re-attaches it by its training key)."""
        self._close_point()
        if self.journal is not None:
            self.journal.persist()
        self._release(until_step=step if checkpoint else None)
        self._stop_sampler("KILLED")
        if self.sender is not None:
            self.sender.close(self.link.flush_timeout_seconds)
        client = self.channel.client
        if self.run_id is not None:
            self.channel.ok(
                "tag the Trainer run interrupted",
                client.set_tag,
                self.run_id,
                INTERRUPTED_AT_TAG,
                str(step),
            )
            self.channel.ok(
                "mark the Trainer run killed", client.set_terminated, self.run_id, "KILLED"
            )
        # A pipeline run this hook made (Kubeflow) stays RUNNING: the retried pod's hook finds
        # its parent among RUNNING runs. `fullthrottle run` ends its own run KILLED itself.
        if self.owns_parent and self.parent_run_id is not None:
            self.channel.ok(
                "tag the pipeline run interrupted",
                client.set_tag,
                self.parent_run_id,
                INTERRUPTED_AT_TAG,
                str(step),
            )
        if self.journal is not None:
            self.journal.close()
        self._write_status()

    def on_train_end(self, result: Any) -> None:
        self._close_point()
        if self.journal is not None:
            self.journal.persist()
        self._release(until_step=None)
        self._stop_sampler("FINISHED")
        if self.run_id is not None and self.sender is not None:
            timestamp, step = _now_ms(), int(result.steps_completed)
            final = [
                Metric(metrics.eval_chart_name(k), float(v), timestamp, step)
                for k, v in (result.eval_metrics or {}).items()
            ]
            for name, value in (
                (metrics.MEAN_EXAMPLES_PER_SECOND, result.examples_per_second),
                (metrics.MEAN_INPUT_WAIT_FRACTION, result.input_wait_fraction),
                (metrics.LOSS_SCALE_SKIPPED_STEPS, result.loss_scale_skipped_steps),
            ):
                final.append(Metric(metrics.chart_name(name), float(value), timestamp, step))
            span = self.cpu.span()
            if span is not None:  # what tracking itself cost while training (see CpuMeter)
                for name, key in (
                    ("cpu_fraction", "fraction"),
                    ("direct_fraction", "direct_fraction"),
                ):
                    final.append(
                        Metric(metric_name(TRACKING_GROUP, name), float(span[key]), timestamp, step)
                    )
            self.sender.send(self.run_id, final)
        if self.sender is not None:
            self.sender.close(self.link.flush_timeout_seconds)
        if self.run_id is not None:
            self.channel.ok(
                "finish the Trainer run",
                self.channel.client.set_terminated,
                self.run_id,
                status="FINISHED",
            )
        if self.owns_parent and self.parent_run_id is not None:
            self.channel.ok(
                "finish the pipeline run",
                self.channel.client.set_terminated,
                self.parent_run_id,
                status="FINISHED",
            )
        if self.journal is not None:
            self.journal.close()
        self._write_status()

    def status(self) -> dict[str, Any]:
        """What got through: the channel's status and the run ids (for the run's summary)."""
        return {
            **self.channel.status(),
            "trainer_run_id": self.run_id,
            "parent_run_id": self.parent_run_id,
        }

    # --- internals ------------------------------------------------------------------------
    def _release(self, *, until_step: int | None) -> None:
        ready = [
            r
            for r in self._pending
            if (until_step is None or r["step"] <= until_step) and r["step"] > self._sent_through
        ]
        self._pending = [
            r for r in self._pending if until_step is not None and r["step"] > until_step
        ]
        if self.run_id is None or self.sender is None:
            if ready:
                self.channel.count_dropped(sum(len(r["values"]) for r in ready))
            return
        self.sender.send(self.run_id, [m for r in ready for m in _metrics_of(r)])

    def _attach_parent(self) -> None:
        """Finds the newest unfinished parent run with the link's pipeline key, or makes one."""
        link, client = self.link, self.channel.client
        if self.experiment_id is None:
            reached, experiment = self.channel.attempt(
                "find the experiment", client.get_experiment_by_name, link.experiment
            )
            if not reached:
                return
            if experiment is None:
                self.experiment_id = self.channel.call(
                    "create the experiment", client.create_experiment, link.experiment
                )
                if self.experiment_id is None:  # created concurrently by someone else?
                    experiment = self.channel.call(
                        "find the experiment", client.get_experiment_by_name, link.experiment
                    )
            if experiment is not None:
                self.experiment_id = experiment.experiment_id
            if self.experiment_id is None:
                return
        found = self.channel.call(
            "find the pipeline run",
            client.search_runs,
            [self.experiment_id],
            filter_string=(
                f"tags.`{PIPELINE_KEY_TAG}` = '{link.pipeline_key}' "
                "and attributes.status = 'RUNNING'"
            ),
            max_results=50,
        )
        if found is None:
            return  # unreachable: a new parent now could duplicate the one we could not see
        if found:
            parent = max(
                found,
                key=lambda r: (int(r.data.tags.get(ATTACHED_AT_TAG) or 0), r.info.start_time),
            )
            self.parent_run_id = parent.info.run_id
            self.owns_parent = parent.data.tags.get(CREATED_BY_TAG) == CREATED_BY_TRAINER
            return
        from fullthrottle.tracking.names import flatten
        from fullthrottle.tracking.sources import source_tags

        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        tags = {
            **source_tags(),
            PIPELINE_KEY_TAG: str(link.pipeline_key),
            PIPELINE_TAG: str(link.pipeline_name),
            ATTACHED_AT_TAG: str(_now_ms()),
            CREATED_BY_TAG: CREATED_BY_TRAINER,
        }
        run = self.channel.call(
            "create the pipeline run",
            client.create_run,
            self.experiment_id,
            run_name=f"{link.pipeline_name}-{stamp}",
            tags=tags,
        )
        if run is None:
            return
        self.parent_run_id, self.owns_parent = run.info.run_id, True
        params = [Param(k, v) for k, v in sorted(flatten(self.run_params).items())]
        for start in range(0, len(params), 100):
            self.channel.ok(
                "log the Trainer's config as params",
                client.log_batch,
                self.parent_run_id,
                params=params[start : start + 100],
            )

    def _attach_run(self, *, training_key: str) -> str | None:
        client = self.channel.client
        query = (
            f"tags.`mlflow.parentRunId` = '{self.parent_run_id}' "
            f"and tags.`{COMPONENT_TAG}` = 'Trainer' and tags.`{TRAINING_KEY_TAG}` = '{training_key}'"
        )
        found = self.channel.call(
            "find the Trainer run",
            client.search_runs,
            [self.experiment_id],
            filter_string=query,
            max_results=5,
        )
        if found is None:
            return None  # the server is unreachable: creating one now could duplicate it later
        if found:
            return sorted(found, key=lambda r: r.info.start_time)[0].info.run_id
        run = self.channel.call(
            "create the Trainer run",
            client.create_run,
            self.experiment_id,
            run_name="Trainer",
            tags={
                "mlflow.parentRunId": str(self.parent_run_id),
                COMPONENT_TAG: "Trainer",
                TRAINING_KEY_TAG: training_key,
            },
        )
        return run.info.run_id if run is not None else None

    def _resend_missing(self, kept: list[dict[str, Any]]) -> None:
        """Sends journaled points (step <= restored step) that MLflow does not have."""
        assert self.run_id is not None and self.sender is not None
        # The loss is always read: it also says how far MLflow's curves already go (below).
        keys = sorted({metrics.LOSS} | {k for r in kept for k in r["values"]})
        have: dict[str, set[int]] = {}
        for key in keys:
            history = self.channel.call(
                f"read the history of {metrics.chart_name(key)}",
                self.channel.client.get_metric_history,
                self.run_id,
                metrics.chart_name(key),
            )
            if history is None:
                # Unknown what the server has: sending could duplicate, so send nothing.
                self.channel.count_dropped(sum(len(r["values"]) for r in kept))
                return
            have[key] = {m.step for m in history}
        # Resuming behind what MLflow has (the newest checkpoint was unreadable and set aside):
        # the steps up to there are trained again but not sent again, so no step appears twice.
        self._sent_through = max((max(steps) for steps in have.values() if steps), default=-1)
        missing = [
            metric
            for record in kept
            for metric in _metrics_of(record)
            if record["step"] not in have[metric.key.split("/", 1)[-1]]
        ]
        if missing:
            _log.info("re-sending %d metric points journaled before the restart", len(missing))
        self.sender.send(self.run_id, missing)

    def _log_derived(self, facts: RunFacts) -> None:
        params = [
            Param(name, str(redact_value(name, value)))
            for name, value in facts.derived_params().items()
        ]
        tags = [
            RunTag("fullthrottle.strategy", facts.strategy_name),
            RunTag("fullthrottle.precision_policy", facts.precision_policy),
            RunTag("fullthrottle.precision_reason", facts.precision_reason[:5000]),
            RunTag("fullthrottle.start_step", str(facts.start_step)),
        ]
        if facts.unreadable_checkpoints:
            tags.append(
                RunTag(UNREADABLE_CHECKPOINTS_TAG, ", ".join(facts.unreadable_checkpoints)[:5000])
            )
        client = self.channel.client
        assert self.run_id is not None and self.parent_run_id is not None
        self.channel.ok(
            "log the Trainer's params", client.log_batch, self.run_id, params=params, tags=tags
        )
        # The parent run carries them too (prefixed), so `compare` and the run list show them.
        parent_params = [Param(f"derived.{p.key}", p.value) for p in params]
        self.channel.ok(
            "log derived params on the pipeline run",
            client.log_batch,
            self.parent_run_id,
            params=parent_params,
            tags=[RunTag("fullthrottle.strategy", facts.strategy_name)]
            + [t for t in tags if t.key == UNREADABLE_CHECKPOINTS_TAG],
        )

    def _stop_sampler(self, status: str) -> None:
        if self._sampler is None:
            return
        sampler, self._sampler = self._sampler, None
        try:
            sampler.stop(status)
        except Exception as exc:  # noqa: BLE001 - a tracking call may fail; training may not
            self.channel.record_failure(f"end MLflow's system metrics: {exc}")

    def _say_gpu_metrics(self) -> None:
        """Says once what is sampled of the GPUs or why nothing is: a tag on the Trainer run and a
        log line (a warning when TensorFlow trains on GPUs that get no metrics)."""
        if self._sampler is not None:
            status = self._sampler.gpu_metrics
        else:
            status = "off: tracking.system_metrics_interval_seconds is 0"
        if self._sampler is None or not self._sampler.has_gpu:
            level = logging.WARNING if hardware.tensorflow_gpus() else logging.INFO
            _log.log(level, "no GPU metrics in MLflow: %s", status)
        assert self.run_id is not None
        self.channel.ok(
            "tag the Trainer run's GPU metrics",
            self.channel.client.set_tag,
            self.run_id,
            GPU_METRICS_TAG,
            status[:5000],
        )

    def _write_status(self) -> None:
        if not self.link.status_path:
            return
        tmp = self.link.status_path + ".tmp"
        os.makedirs(os.path.dirname(self.link.status_path), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.status(), f)
        os.replace(tmp, self.link.status_path)


def trainer_hooks(
    link_config: Any, *, run_params: Mapping[str, str] | None = None
) -> list[TrainingHook]:
    """The tracking hooks for this Trainer: one MLflow hook when its custom_config carries a link
    (`store.LINK_KEY`), none otherwise (tracking off). `run_params` are logged on a parent run
    the hook has to make itself."""
    link = TrainerLink.from_config(link_config)
    return [MlflowTrainingHook(link, run_params=run_params)] if link is not None else []
