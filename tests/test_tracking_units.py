"""Tracking pieces that need no pipeline: redaction, the run key, a dead server, the journal."""

from __future__ import annotations

import dataclasses
import time

import pytest

from fullthrottle.core.config import load_config
from fullthrottle.core.redact import REDACTED, redact_text
from fullthrottle.tracking.channel import Channel, MetricSender
from fullthrottle.tracking.hook import CpuMeter, Journal
from fullthrottle.tracking.pipeline_run import config_params, run_key
from tests.tracking_server import free_port
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


def test_sender_holds_points_for_its_interval_and_a_flush_sends_them_at_once(tmp_path):
    from mlflow.entities import Metric

    channel = Channel(f"sqlite:///{tmp_path / 'mlflow.db'}", retries=0, backoff_seconds=0.1)
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


def test_fast_loops_become_one_point_per_resolution_exactly_once_across_a_kill(tmp_path):
    import dataclasses
    from types import SimpleNamespace

    from fullthrottle.bench.tracked import link_for_new_run
    from fullthrottle.tracking.hook import MlflowTrainingHook

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    link = dataclasses.replace(
        link_for_new_run(uri, status_dir=str(tmp_path), system_metrics_interval_seconds=0),
        metrics_interval_seconds=0.0,
        metrics_resolution_seconds=1.0,
    )
    work = str(tmp_path / "work")

    def loop_metrics(step):  # 10 steps in 0.3 s: four loops make a point (1.2 s >= 1 s)
        return {"loss": float(step), "learning_rate": 0.1, "examples_per_second": 1000.0 + step,
                "input_wait_fraction": 0.0, "step_time": 0.03, "steps": 10, "wall_time": 0.3}  # fmt: skip

    def train(hook, steps, checkpoint_every=50):
        for step in steps:
            hook.on_loop_end(step, loop_metrics(step))
            if step % checkpoint_every == 0:
                hook.on_checkpoint(step, f"ckpt-{step}")

    def facts(start_step):
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
            train_steps=250,
            input_cached=True,
            input_cache_reason="set in config",
            checkpoint_saves="traced",
            work_dir=work,
        )

    first = MlflowTrainingHook(link)
    first.on_train_begin(facts(0))
    train(first, range(10, 180, 10))  # points at 40, 80, 120, 160; checkpoints at 50, 100, 150
    assert first.sender is not None and first.sender.flush(timeout=20)
    run_id = first.run_id
    # Killed at step 170: no on_train_end. Only the points a checkpoint covers were sent.
    client = first.channel.client
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [40, 80, 120]
    # The run's facts became its derived params, on the Trainer run and (prefixed) its parent.
    params = client.get_run(run_id).data.params
    assert params["model"] == "tabular" and params["scaled_learning_rate"] == "0.001"
    assert params["parameters"] == "100" and params["strategy"] == "OneDeviceStrategy"
    parent = client.get_run(link.parent_run_id).data.params
    assert parent["derived.global_batch_size"] == "64"

    second = MlflowTrainingHook(link)
    second.on_train_begin(facts(150))  # the checkpoint at 150
    assert second.run_id == run_id  # found again, not created twice
    train(second, range(160, 260, 10))
    second.on_train_end(
        SimpleNamespace(
            steps_completed=250,
            eval_metrics={},
            examples_per_second=1.0,
            input_wait_fraction=0.0,
            loss_scale_skipped_steps=0,
        )  # fmt: skip
    )
    history = sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)
    # 130-150 were trained and checkpointed before the kill but had no point: one at 150.
    assert [m.step for m in history] == [40, 80, 120, 150, 190, 230, 250]
    # Every loop counted once: a point's loss is its loops' mean, so loss x steps spanned sums
    # to the loops' loss x steps (a loop lost or counted twice changes the sum).
    steps = [m.step for m in history]
    spans = [b - a for a, b in zip([0, *steps[:-1]], steps, strict=True)]
    assert sum(m.value * span for m, span in zip(history, spans, strict=True)) == pytest.approx(
        sum(step * 10 for step in range(10, 260, 10))
    )
    rates = {m.step: m.value for m in client.get_metric_history(run_id, "examples_per_second")}
    assert rates[40] == pytest.approx(1025.0) and rates[250] == pytest.approx(1245.0)
    step_time = client.get_metric_history(run_id, "step_time")
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

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    link = dataclasses.replace(
        link_for_new_run(uri, status_dir=str(tmp_path), system_metrics_interval_seconds=0.2),
        metrics_interval_seconds=0.0,
        metrics_resolution_seconds=0.0,
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
    said = [r.getMessage() for r in caplog.records if "GPU metrics" in r.getMessage()]
    if tf.config.list_physical_devices("GPU"):  # a GPU machine: its metrics are there
        assert run.data.tags[GPU_METRICS_TAG].endswith("GPU(s): utilization, memory used, power")
        assert "system/gpu_0_utilization_percentage" in run.data.metrics
        assert "system/gpu_0_memory_usage_megabytes" in run.data.metrics
        assert said == []
    else:
        # Why there are none, once, on the run and in the log; NVML's own words say no driver.
        tag = run.data.tags[GPU_METRICS_TAG]
        assert tag.startswith("unavailable: ") and "NVML Shared Library Not Found" in tag, tag
        assert said == [f"no GPU metrics in MLflow: {tag}"]
        assert not [k for k in run.data.metrics if k.startswith("system/gpu")]
    # CPU and memory are sampled all the same, at training steps, beside the training metrics.
    client = hook.channel.client
    for key in ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"):
        history = client.get_metric_history(hook.run_id, key)
        assert len(history) >= 2 and {m.step for m in history} <= {0, 10, 20, 30}, key
    assert [m.step for m in client.get_metric_history(hook.run_id, "loss")] == [10, 20, 30]
    assert run.info.status == "FINISHED"
