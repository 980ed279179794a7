"""Tracking pieces that need no pipeline: params, redaction, the run key, the Trainer's link, a
dead server, the journal, points per curve, the parent run the Trainer finds or makes."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from fullthrottle.core.config import load_config
from fullthrottle.core.redact import REDACTED, redact_text
from fullthrottle.tracking.channel import Channel, MetricSender
from fullthrottle.tracking.hook import CpuMeter, Journal
from fullthrottle.tracking.pipeline_run import config_params, run_key
from fullthrottle.tracking.store import seed_sqlite_store
from tests.helpers import gpu_set_installed
from tests.tracking_server import free_port, new_sqlite_store
from trainer_module.training import RunFacts


def test_secrets_are_masked_in_uris_and_secret_fields_but_ordinary_fields_survive():
    assert (
        redact_text("https://bob:hunter2@mlflow.example:443/x")
        == f"https://bob:{REDACTED}@mlflow.example:443/x"
    )
    assert (
        redact_text("http://h/x?access_token=abc123&page=2")
        == f"http://h/x?access_token={REDACTED}&page=2"
    )
    config = load_config(
        overrides=[
            "tracking.uri=https://alice:s3cret@tracking.example",
            "beam.extra_args=['--api_token=xyz']",
        ]
    )
    params = config_params(config)
    assert (
        "s3cret" not in str(params)
        and params["tracking.uri"] == f"https://alice:{REDACTED}@tracking.example"
    )
    assert "xyz" not in params["beam.extra_args"]
    assert params["training.per_replica_batch_size"] == "64"
    assert params["data.label"] == "species"
    # Only what applies to a local run: no Kubeflow section, no unset field written as 'None'.
    assert not [k for k in params if k.startswith("kubeflow.")]
    assert "None" not in params.values() and "data.schema_path" not in params
    assert "training.profile_steps" not in params  # unset by default


def test_the_trainer_link_is_the_same_on_every_run_and_carries_no_credentials(tmp_path):
    from fullthrottle.tracking.store import TrainerLink, resolve_destination, trainer_link

    config = load_config(
        overrides=[
            f"output_dir={tmp_path}",
            "tracking.uri=https://alice:s3cret@mlflow.example/x?token=t",
        ]
    )
    destination = resolve_destination(config)

    def link(cfg, root):
        return trainer_link(cfg, destination, pipeline_root=root).to_config()

    first = link(config, str(config.pipeline_root))
    # What goes into the Trainer's custom_config, and so into TFX's cache key: the same for
    # every run of this pipeline (nothing per run, such as a parent run id, is in it).
    assert first == link(config, str(config.pipeline_root))
    assert "parent_run_id" not in first and "s3cret" not in str(first) and "token" not in str(first)
    assert first["uri"] == "https://mlflow.example/x"
    assert first["experiment"] == "fullthrottle-penguins"
    # Another pipeline root (another output folder, or the Kubeflow root) is another pipeline.
    assert link(config, "gs://bucket/root")["pipeline_key"] != first["pipeline_key"]
    assert TrainerLink.from_config(first) == TrainerLink(**first)
    assert TrainerLink.from_config(None) is None


def test_run_key_follows_config_data_and_code_but_not_tracking_settings(tmp_path):
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,x\n")
    config = load_config(overrides=[f"output_dir={tmp_path}"])
    key = run_key(config, source_files=(str(data),), code_fingerprint="c1")
    retracked = dataclasses.replace(
        config, tracking=dataclasses.replace(config.tracking, retries=9)
    )
    assert run_key(retracked, source_files=(str(data),), code_fingerprint="c1") == key
    assert run_key(config, source_files=(str(data),), code_fingerprint="c2") != key
    retrained = load_config(overrides=[f"output_dir={tmp_path}", "training.learning_rate=0.01"])
    assert run_key(retrained, source_files=(str(data),), code_fingerprint="c1") != key
    data.write_text("a,b\n1,y\n")
    assert run_key(config, source_files=(str(data),), code_fingerprint="c1") != key


def test_unreachable_server_is_retried_then_reported_and_later_calls_fail_fast(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    channel = Channel(f"http://127.0.0.1:{free_port()}", retries=2, backoff_seconds=0.1)
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return channel.client.get_experiment_by_name("x")

    assert channel.ok("first", counted) is False
    assert len(calls) == 3  # one try + two retries
    assert channel.ok("second", counted) is False
    assert len(calls) == 4  # degraded: a single attempt
    sender = MetricSender(channel)
    from mlflow.entities import Metric

    sender.send("no-such-run", [Metric("loss", 1.0, int(time.time() * 1000), 1)])
    assert sender.close(timeout=30)
    status = channel.status()
    assert (
        status["complete"] is False
        and status["dropped_metric_points"] == 1
        and status["failure_count"] == 3
    )


def test_journal_keeps_records_up_to_the_restored_step_and_survives_a_torn_line(tmp_path):
    journal = Journal(str(tmp_path / "j.jsonl"))
    for step in (25, 50, 75, 100, 125):
        journal.append({"step": step, "timestamp": 0, "values": {"loss": 1.0 / step}})
    journal.close()
    with open(tmp_path / "j.jsonl", "a") as f:
        f.write('{"step": 150, "timest')  # killed mid-write
    kept = Journal(str(tmp_path / "j.jsonl")).keep_until(100)
    assert [r["step"] for r in kept] == [25, 50, 75, 100]
    assert [r["step"] for r in Journal(str(tmp_path / "j.jsonl")).read()] == [25, 50, 75, 100]


def test_a_journal_on_an_object_store_is_written_when_persisted(tmp_path):
    # ram:// is TensorFlow's in-memory filesystem: like gs://, no appends, seen through tf.io.gfile.
    path = f"ram://journal-{time.monotonic_ns()}/j.jsonl"
    import tensorflow as tf

    tf.io.gfile.makedirs(path.rsplit("/", 1)[0])
    journal = Journal(path)
    for step in (25, 50):
        journal.append({"step": step, "timestamp": 0, "values": {"loss": 1.0 / step}})
    assert Journal(path).read() == []  # not yet persisted: what a kill here would lose
    journal.persist()  # at a checkpoint, before the points it covers are released
    assert [r["step"] for r in Journal(path).read()] == [25, 50]
    journal.append({"step": 75, "timestamp": 0, "values": {"loss": 0.1}})
    journal.close()
    assert [r["step"] for r in Journal(path).keep_until(50)] == [25, 50]
    assert [r["step"] for r in Journal(path).read()] == [25, 50]


def test_sender_holds_points_for_its_interval_and_a_flush_sends_them_at_once(tmp_path):
    from mlflow.entities import Metric

    channel = Channel(new_sqlite_store(tmp_path), retries=0, backoff_seconds=0.1)
    experiment = channel.client.create_experiment("sender")
    run_id = channel.client.create_run(experiment).info.run_id
    requests = []
    log_batch = channel.client.log_batch

    def counted_log_batch(*args, **kwargs):  # the real store call, counted
        requests.append(len(kwargs["metrics"]))
        return log_batch(*args, **kwargs)

    channel.client.log_batch = counted_log_batch
    sender = MetricSender(channel, interval_seconds=60.0)

    def point(step):
        return [Metric("loss", 1.0 / step, int(time.time() * 1000), step)]

    def steps_stored():
        return sorted(m.step for m in channel.client.get_metric_history(run_id, "loss"))

    sender.send(run_id, point(1))  # the first request goes out at once
    deadline = time.monotonic() + 20
    while steps_stored() != [1] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert steps_stored() == [1]
    for step in (2, 3, 4):
        sender.send(run_id, point(step))
    time.sleep(1.0)
    assert steps_stored() == [1]  # held back: the interval (60 s) has not passed
    assert sender.flush(timeout=20)  # ends the wait: far sooner than 60 s
    assert steps_stored() == [1, 2, 3, 4]
    assert requests == [1, 3]  # the held points went out in one request
    assert sender.close(timeout=20)
    assert channel.status()["complete"]


def _facts(work: str, start_step: int, train_steps: int = 250) -> RunFacts:
    return RunFacts(
        strategy_name="OneDeviceStrategy",
        num_replicas=1,
        num_workers=1,
        global_batch_size=64,
        per_replica_batch_size=64,
        gradient_accumulation_steps=1,
        learning_rate=0.001,
        precision_policy="float32",
        precision_reason="set in config",
        model_kind="tabular",
        parameters=100,
        start_step=start_step,
        train_steps=train_steps,
        input_cached=True,
        input_cache_reason="set in config",
        checkpoint_saves="traced",
        work_dir=work,
    )


def test_fast_loops_become_points_of_equal_step_spans_exactly_once_across_a_kill(tmp_path):
    import dataclasses
    from types import SimpleNamespace

    from fullthrottle.bench.tracked import link_for_new_run
    from fullthrottle.tracking.hook import MlflowTrainingHook

    uri = new_sqlite_store(tmp_path)
    link = dataclasses.replace(
        link_for_new_run(uri, status_dir=str(tmp_path), system_metrics_interval_seconds=0),
        metrics_interval_seconds=0.0,
        points_per_curve=7,  # 280 steps in spans of 40: a point at 40, 80, 120, ...
    )
    work = str(tmp_path / "work")

    def loop_metrics(step):  # 10 steps in 0.3 s: four loops make a point
        return {"loss": float(step), "learning_rate": 0.1, "examples_per_second": 1000.0 + step,
                "input_wait_fraction": 0.0, "step_time": 0.03, "steps": 10, "wall_time": 0.3}  # fmt: skip

    def train(hook, steps, checkpoint_every=50):
        for step in steps:
            hook.on_loop_end(step, loop_metrics(step))
            if step % checkpoint_every == 0:
                hook.on_checkpoint(step, f"ckpt-{step}")

    def facts(start_step):
        return _facts(work, start_step, train_steps=280)

    first = MlflowTrainingHook(link)
    first.on_train_begin(facts(0))
    train(first, range(10, 180, 10))  # points at 40, 80, 120, 160; checkpoints at 50, 100, 150
    assert first.sender is not None and first.sender.flush(timeout=20)
    run_id = first.run_id
    # Killed at step 170: no on_train_end. Only the points a checkpoint covers were sent.
    client = first.channel.client
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [40, 80, 120]
    # The run's facts became its derived params, on the Trainer run and (prefixed) its parent.
    params = client.get_run(run_id).data.params
    assert params["model"] == "tabular" and params["scaled_learning_rate"] == "0.001"
    assert params["parameters"] == "100" and params["strategy"] == "OneDeviceStrategy"
    parent = client.get_run(link.parent_run_id).data.params
    assert parent["derived.global_batch_size"] == "64"

    second = MlflowTrainingHook(link)
    second.on_train_begin(facts(150))  # the checkpoint at 150
    assert second.run_id == run_id  # found again, not created twice
    train(second, range(160, 290, 10))
    second.on_train_end(
        SimpleNamespace(
            steps_completed=280,
            eval_metrics={},
            examples_per_second=1.0,
            input_wait_fraction=0.0,
            loss_scale_skipped_steps=0,
        )  # fmt: skip
    )
    history = sorted(client.get_metric_history(run_id, "train/loss"), key=lambda m: m.step)
    # 130-150 were trained and checkpointed before the kill but had no point: one at 150. The
    # grid goes on where it was: a point in each 40-step span, at its first loop end.
    assert [m.step for m in history] == [40, 80, 120, 150, 160, 200, 240, 280]
    # Every loop counted once: a point's loss is its loops' mean, so loss x steps spanned sums
    # to the loops' loss x steps (a loop lost or counted twice changes the sum).
    steps = [m.step for m in history]
    spans = [b - a for a, b in zip([0, *steps[:-1]], steps, strict=True)]
    assert sum(m.value * span for m, span in zip(history, spans, strict=True)) == pytest.approx(
        sum(step * 10 for step in range(10, 290, 10))
    )
    rates = {
        m.step: m.value for m in client.get_metric_history(run_id, "train/examples_per_second")
    }
    assert rates[40] == pytest.approx(1025.0) and rates[280] == pytest.approx(1265.0)
    step_time = client.get_metric_history(run_id, "train/step_time")
    assert {round(m.value, 6) for m in step_time} == {0.03}
    # System metrics are off in this link, and the run says so instead of a GPU reason.
    assert client.get_run(run_id).data.tags["fullthrottle.gpu_metrics"] == (
        "off: tracking.system_metrics_interval_seconds is 0"
    )
    # Its own CPU time: the hook's work after each loop and the sender's requests were counted.
    assert second.cpu.totals["hook"] > 0 and second.cpu.totals["sender"] > 0
    assert second.cpu.totals["system"] == 0  # system metrics are off in this link
    span = second.cpu.span()
    assert span is not None and span["hook"] > 0 and span["wall_seconds"] > 0
    # The direct cost: the hook's wall time (training waits for it, CPU or I/O) plus the other
    # threads' CPU.
    assert span["hook_wall"] > 0
    assert span["direct_fraction"] == pytest.approx(
        (span["hook_wall"] + span["sender"] + span["system"]) / span["wall_seconds"]
    )
    assert span["fraction"] == pytest.approx(
        (span["hook"] + span["sender"] + span["system"]) / span["wall_seconds"]
    )


def test_the_trainer_joins_the_newest_pipeline_run_of_its_pipeline_or_makes_one(tmp_path):
    """Without `fullthrottle run` (Kubeflow) the hook makes the parent run, logs the Trainer's
    config on it and ends it; with one, it joins the run started or re-attached last and
    leaves ending it to `fullthrottle run`. A killed Trainer's retry finds its own parent."""
    from types import SimpleNamespace

    from mlflow.tracking import MlflowClient

    from fullthrottle.tracking.hook import MlflowTrainingHook
    from fullthrottle.tracking.names import ATTACHED_AT_TAG, CREATED_BY_TAG, PIPELINE_KEY_TAG
    from fullthrottle.tracking.store import TrainerLink

    uri = new_sqlite_store(tmp_path)
    link = TrainerLink(
        uri=uri,
        experiment="pipes",
        pipeline_name="pipe",
        pipeline_key="k1",
        retries=0,
        system_metrics_interval_seconds=0,
        metrics_interval_seconds=0,
    )
    client = MlflowClient(uri)
    done = SimpleNamespace(
        steps_completed=20,
        eval_metrics={"accuracy": 0.5},
        examples_per_second=1.0,
        input_wait_fraction=0.0,
        loss_scale_skipped_steps=0,
    )

    def train(hook, work, start=0):
        hook.on_train_begin(_facts(str(work), start, train_steps=20))
        for step in range(start + 10, 21, 10):
            hook.on_loop_end(step, {"loss": 1.0, "steps": 10, "wall_time": 0.1})
            hook.on_checkpoint(step, f"ckpt-{step}")

    # No pipeline run: the hook makes one, in an experiment it makes too.
    killed = MlflowTrainingHook(
        link, run_params={"training": {"learning_rate": 0.01, "cache": None}}
    )
    train(killed, tmp_path / "a")  # ... and is killed: no on_train_end
    made = client.get_run(killed.parent_run_id)
    assert made.info.status == "RUNNING" and killed.owns_parent
    assert made.data.tags[PIPELINE_KEY_TAG] == "k1" and made.data.tags[CREATED_BY_TAG] == "Trainer"
    assert made.data.params["training.learning_rate"] == "0.01"
    assert "training.cache" not in made.data.params  # unset: not a param
    assert made.data.tags["mlflow.user"] and made.data.tags["mlflow.source.name"]
    retry = MlflowTrainingHook(link)
    train(retry, tmp_path / "a", start=10)
    assert retry.parent_run_id == killed.parent_run_id and retry.run_id == killed.run_id
    retry.on_train_end(done)
    assert client.get_run(retry.parent_run_id).info.status == "FINISHED"  # it made it: it ends it
    trainer = client.get_run(retry.run_id)
    assert trainer.info.status == "FINISHED"
    assert trainer.data.metrics["eval/accuracy"] == 0.5 and "train/loss" in trainer.data.metrics
    assert retry.status()["complete"] and retry.status()["parent_run_id"] == made.info.run_id

    # Two unfinished pipeline runs (say, a killed one and the current one): the newest attached.
    experiment = client.get_experiment_by_name("pipes").experiment_id
    older, newer = (
        client.create_run(experiment, tags={PIPELINE_KEY_TAG: "k1", ATTACHED_AT_TAG: at})
        for at in ("2000", "1000")
    )
    client.set_tag(newer.info.run_id, ATTACHED_AT_TAG, "3000")  # re-attached by a rerun
    client.create_run(experiment, tags={PIPELINE_KEY_TAG: "other", ATTACHED_AT_TAG: "9000"})
    joined = MlflowTrainingHook(link)
    train(joined, tmp_path / "b")
    joined.on_train_end(done)
    assert joined.parent_run_id == newer.info.run_id and not joined.owns_parent
    assert client.get_run(newer.info.run_id).info.status == "RUNNING"  # `fullthrottle run` ends it
    assert client.get_run(older.info.run_id).info.status == "RUNNING"
    assert client.get_run(newer.info.run_id).data.params["derived.global_batch_size"] == "64"


def test_a_stopped_trainer_is_killed_in_mlflow_and_its_retry_continues_both_runs(tmp_path):
    """On a signal the hook sends what the checkpoint covers and ends the Trainer run KILLED; a
    parent it made (Kubeflow) stays RUNNING for the retried pod, which re-attaches both runs; a
    resume from behind the curve (the newest checkpoint set aside) sends no step twice."""
    from mlflow.tracking import MlflowClient

    from fullthrottle.tracking.hook import MlflowTrainingHook
    from fullthrottle.tracking.names import INTERRUPTED_AT_TAG
    from fullthrottle.tracking.store import TrainerLink

    uri = new_sqlite_store(tmp_path)
    link = TrainerLink(
        uri=uri,
        experiment="pipes",
        pipeline_name="pipe",
        pipeline_key="k2",
        retries=0,
        system_metrics_interval_seconds=0,
        metrics_interval_seconds=0,
        points_per_curve=0,  # a point per loop
    )
    client = MlflowClient(uri)
    work = str(tmp_path / "work")

    def loops(hook, start, stop):
        for step in range(start + 10, stop + 1, 10):
            hook.on_loop_end(step, {"loss": 1.0, "steps": 10, "wall_time": 0.1})

    stopped = MlflowTrainingHook(link)
    stopped.on_train_begin(_facts(work, 0, train_steps=100))
    loops(stopped, 0, 40)
    stopped.on_checkpoint(40, "ckpt-40")
    stopped.on_interrupt(40, "ckpt-40")
    trainer = client.get_run(stopped.run_id)
    assert trainer.info.status == "KILLED" and trainer.data.tags[INTERRUPTED_AT_TAG] == "40"
    assert client.get_run(stopped.parent_run_id).info.status == "RUNNING"
    assert [m.step for m in client.get_metric_history(stopped.run_id, "train/loss")] == [
        10,
        20,
        30,
        40,
    ]

    # The retry resumes from step 20 (ckpt-40 was unreadable): steps 30 and 40 are trained
    # again, but MLflow keeps the points it has.
    retry = MlflowTrainingHook(link)
    retry.on_train_begin(_facts(work, 20, train_steps=100))
    assert (retry.parent_run_id, retry.run_id) == (stopped.parent_run_id, stopped.run_id)
    assert client.get_run(retry.run_id).info.status == "RUNNING"
    loops(retry, 20, 60)
    retry.on_checkpoint(60, "ckpt-60")
    retry.on_interrupt(60, "ckpt-60")
    steps = [m.step for m in client.get_metric_history(retry.run_id, "train/loss")]
    assert sorted(steps) == [10, 20, 30, 40, 50, 60]


def test_cpu_meter_counts_a_hook_blocked_on_io_in_the_direct_cost_not_in_cpu():
    meter = CpuMeter()
    meter.mark_loop_end()
    with meter.measuring("hook"):
        time.sleep(0.2)  # what a hook waiting on a slow disk or a lock looks like: no CPU
    meter.mark_loop_end()
    span = meter.span()
    assert span["hook_wall"] >= 0.2
    assert span["hook"] < 0.05
    assert span["direct_fraction"] >= 0.2 / span["wall_seconds"] > 10 * span["fraction"]


def test_without_a_gpu_the_trainer_run_says_why_and_cpu_and_memory_metrics_still_arrive(
    tmp_path, caplog
):
    import logging
    from types import SimpleNamespace

    import tensorflow as tf

    from fullthrottle.bench.tracked import link_for_new_run
    from fullthrottle.tracking.hook import GPU_METRICS_TAG, MlflowTrainingHook

    uri = new_sqlite_store(tmp_path)
    link = dataclasses.replace(
        link_for_new_run(uri, status_dir=str(tmp_path), system_metrics_interval_seconds=0.2),
        metrics_interval_seconds=0.0,
    )
    facts = RunFacts(
        strategy_name="OneDeviceStrategy", num_replicas=1, num_workers=1, global_batch_size=64,
        per_replica_batch_size=64, gradient_accumulation_steps=1, learning_rate=0.001,
        precision_policy="float32", precision_reason="set in config", model_kind="tabular",
        parameters=100, start_step=0, train_steps=30, input_cached=True,
        input_cache_reason="set in config", checkpoint_saves="traced", work_dir=str(tmp_path / "w"),
    )  # fmt: skip
    hook = MlflowTrainingHook(link)
    caplog.set_level(logging.INFO, logger="fullthrottle.tracking")
    hook.on_train_begin(facts)
    for step in (10, 20, 30):
        time.sleep(0.3)  # the sampler takes a point every 0.2 s
        hook.on_loop_end(step, {"loss": 1.0 / step, "steps": 10, "wall_time": 0.3})
        hook.on_checkpoint(step, f"ckpt-{step}")
    hook.on_train_end(
        SimpleNamespace(
            steps_completed=30,
            eval_metrics={},
            examples_per_second=1.0,
            input_wait_fraction=0.0,
            loss_scale_skipped_steps=0,
        )  # fmt: skip
    )
    run = hook.channel.client.get_run(hook.run_id)
    # What fullthrottle says (MLflow's sampler says it skips GPU metrics in its own words too).
    said = [
        r.getMessage()
        for r in caplog.records
        if "GPU metrics" in r.getMessage() and r.name.startswith("fullthrottle")
    ]
    if tf.config.list_physical_devices("GPU"):  # a GPU machine: its metrics are there
        assert run.data.tags[GPU_METRICS_TAG].endswith("GPU(s): utilization, memory used, power")
        assert "system/gpu_0_utilization_percentage" in run.data.metrics
        assert "system/gpu_0_memory_usage_megabytes" in run.data.metrics
        assert said == []
    else:
        # Why there are none, once, on the run and in the log; NVML's own words say no driver.
        tag = run.data.tags[GPU_METRICS_TAG]
        # Without the gpu install set NVML's binding is not there; with it, the driver's library.
        nvml_error = (
            "NVML Shared Library Not Found"
            if gpu_set_installed()
            else "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
        )
        assert tag == f"unavailable: {nvml_error}", tag
        assert said == [f"no GPU metrics in MLflow: {tag}"]
        assert not [k for k in run.data.metrics if k.startswith("system/gpu")]
    # CPU and memory are sampled all the same, by MLflow's own system metrics (its public API),
    # numbered by MLflow from 0, beside the training metrics.
    client = hook.channel.client
    for key in ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"):
        history = client.get_metric_history(hook.run_id, key)
        steps = sorted(m.step for m in history)
        assert len(history) >= 2 and steps == list(range(len(steps))), key
    # MLflow's sampling thread is tracking's "system" CPU part.
    assert hook.cpu.totals["system"] > 0
    assert [m.step for m in client.get_metric_history(hook.run_id, "train/loss")] == [10, 20, 30]
    assert run.info.status == "FINISHED"


def test_a_scoped_tracking_uri_leaves_an_unset_uri_unset(tmp_path, monkeypatch):
    """Logging a model sets MLflow's process-wide URI for a moment; afterwards a URI that was not
    set is not set (neither MLflow's global nor $MLFLOW_TRACKING_URI, which MLflow exports), so
    later runs in the process still resolve their own store; a URI that was set comes back."""
    import os

    import mlflow
    import mlflow.tracking

    from fullthrottle.tracking.store import scoped_tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow.set_tracking_uri(None)
    with scoped_tracking_uri(f"sqlite:///{tmp_path / 'a.db'}"):
        assert mlflow.get_tracking_uri() == f"sqlite:///{tmp_path / 'a.db'}"
    assert not mlflow.tracking.is_tracking_uri_set()
    assert "MLFLOW_TRACKING_URI" not in os.environ
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        with scoped_tracking_uri(f"sqlite:///{tmp_path / 'a.db'}"):
            pass
        assert mlflow.get_tracking_uri() == f"sqlite:///{tmp_path / 'b.db'}"
    finally:
        mlflow.set_tracking_uri(None)


def test_a_new_store_is_a_copy_of_an_empty_mlflow_store_and_an_existing_file_is_kept(tmp_path):
    """A run's first store is a copy of an empty one made by this MLflow: at MLflow's newest
    schema (MLflow opens it without migrating), its Default experiment in the store's own
    artifact folder, one file per store; a file already there is never replaced."""
    import sqlite3

    from mlflow.store.db.utils import _get_latest_schema_revision
    from mlflow.tracking import MlflowClient

    from fullthrottle.tracking.store import embedded_destination, prepare_store

    stores = [embedded_destination(tmp_path / name) for name in ("first", "second")]
    for destination in stores:
        prepare_store(destination)
        database = destination.uri.removeprefix("sqlite:///")
        with sqlite3.connect(database) as connection:
            (revision,) = connection.execute("SELECT version_num FROM alembic_version").fetchone()
        assert revision == _get_latest_schema_revision()
    first = MlflowClient(stores[0].uri, stores[0].uri)
    assert [(e.experiment_id, e.artifact_location) for e in first.search_experiments()] == [
        ("0", f"{stores[0].artifact_root}/0")
    ]
    run = first.create_run(first.create_experiment("kept", stores[0].artifact_root))
    first.log_metric(run.info.run_id, "loss", 0.5)
    first.create_registered_model("model")
    second = MlflowClient(stores[1].uri, stores[1].uri)
    assert [e.name for e in second.search_experiments()] == ["Default"]
    assert second.search_registered_models() == []
    # An existing store (with its run) and a file that is not a store stay byte for byte.
    written = Path(stores[0].uri.removeprefix("sqlite:///")).read_bytes()
    prepare_store(stores[0])
    assert Path(stores[0].uri.removeprefix("sqlite:///")).read_bytes() == written
    other = tmp_path / "other" / "mlflow.db"
    other.parent.mkdir()
    other.write_bytes(b"not a store")
    seed_sqlite_store(other, None)
    assert other.read_bytes() == b"not a store"
    assert sorted(p.name for p in other.parent.iterdir()) == ["mlflow.db"]  # no partial copy left
