"""MLflow tracking of real pipeline runs, against a real `mlflow server` (SQLite, 127.0.0.1).

One output folder is shared by the runs below so that ExampleGen..Transform run once and are
cached afterwards (the runs differ in training config only). Runs:
  A  killed with SIGKILL during training, after a checkpoint; then rerun to completion;
  B  a different learning rate, same server (for `compare`);
  C  a second server that is killed during training.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.entities import LoggedModelStatus
from mlflow.tracking import MlflowClient
from tensorflow_metadata.proto.v0 import statistics_pb2

from fullthrottle.tracking.names import RUN_KEY_TAG
from tests.helpers import REPO, committed_checkpoint_step, last_run, run_cli
from tests.tracking_server import MlflowServer

pytestmark = pytest.mark.slow

STEPS_A = 1200
STEPS_B = 3000
LOOP = 25
COMMON = (
    "--set", f"training.steps_per_loop={LOOP}",
    "--set", "training.checkpoint_every_steps=100",
    "--set", "tracking.system_metrics_interval_seconds=1",
    # A point per loop, so every loop's step can be checked across the kill; aggregating loops
    # into about 100 points per curve (the default) is checked with run B and in test_tracking_units.
    "--set", "tracking.points_per_curve=0",
)  # fmt: skip


def _cli_env(uri: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["MLFLOW_TRACKING_URI"] = uri
    return env


def _start_cli(*args: str, uri: str, log: Path) -> subprocess.Popen:
    # Such runs get SIGKILLed: their scratch temp folder stays in the test's tmp, beside the log.
    temp = log.with_name(f"{log.stem}-tmp")
    temp.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "fullthrottle", *args],
        cwd=REPO,
        env={**_cli_env(uri), "TMPDIR": str(temp)},
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        text=True,
    )


def _pipeline_root(output_dir: Path) -> Path:
    return output_dir / "pipeline_root" / "fullthrottle-penguins"


def _wait_for_checkpoint(
    process: subprocess.Popen, output_dir: Path, *, at_least: int, log: Path
) -> None:
    """Polls until a checkpoint of step >= `at_least` is committed (named by the state file)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if committed_checkpoint_step(_pipeline_root(output_dir)) >= at_least:
            return
        assert process.poll() is None, f"run ended before a checkpoint:\n{log.read_text()[-4000:]}"
        time.sleep(0.05)
    raise AssertionError("no checkpoint within 600 s")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    started = MlflowServer(tmp_path_factory.mktemp("mlflow_server"))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tracked_runs")


@pytest.fixture(scope="module")
def run_a(server, output_dir):
    """Run A: SIGKILLed during training after a checkpoint, then rerun to completion."""
    args = (
        "run",
        "--output-dir",
        str(output_dir),
        "--set",
        f"training.train_steps={STEPS_A}",
        *COMMON,
    )
    log = output_dir / "run_a_killed.log"
    process = _start_cli(*args, uri=server.uri, log=log)
    try:
        _wait_for_checkpoint(process, output_dir, at_least=200, log=log)
    finally:
        process.kill()  # SIGKILL: no cleanup, no flush, the MLflow run stays RUNNING
        process.wait()
    # Read once the process is dead: it may have committed another checkpoint before the kill
    # landed (saves come every ~0.1 s here), and the rerun must resume from the newest one.
    killed_after = committed_checkpoint_step(_pipeline_root(output_dir))
    assert killed_after < STEPS_A, "training finished before the kill; the test would prove nothing"
    result = run_cli(*args, env={"MLFLOW_TRACKING_URI": server.uri})
    assert result.returncode == 0, result.stderr[-5000:]
    return killed_after, result


def _parent_runs(client: MlflowClient, experiment: str = "fullthrottle-penguins"):
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    return client.search_runs([experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` != ''")


def _children(client: MlflowClient, parent, component: str):
    return client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and tags.`fullthrottle.component` = '{component}'",
    )


def test_killed_run_resumes_into_one_mlflow_run_without_duplicate_or_missing_steps(
    server, output_dir, run_a
):
    killed_after, result = run_a
    assert f"resumed from step {killed_after}" in result.stderr, (
        "the rerun did not resume the killed training"
    )
    client = MlflowClient(server.uri)
    parents = _parent_runs(client)
    assert len(parents) == 1, [p.info.run_id for p in parents]
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["fullthrottle.attempts"] == "2"
    trainers = _children(client, parent, "Trainer")
    assert len(trainers) == 1
    expected = list(range(LOOP, STEPS_A + 1, LOOP))
    for key in ("train/loss", "train/learning_rate", "train/examples_per_second",
                "train/input_wait_fraction"):  # fmt: skip
        steps = sorted(m.step for m in client.get_metric_history(trainers[0].info.run_id, key))
        assert steps == expected, (
            f"{key}: duplicated or missing steps {sorted(set(expected) ^ set(steps))[:10]}"
        )
    assert last_run(output_dir)["tracking"]["reattached"] is True


def test_pipeline_run_is_tracked_with_params_metrics_artifacts_and_registered_model(
    server, output_dir, run_a, tmp_path
):
    client = MlflowClient(server.uri)
    (parent,) = _parent_runs(client)
    last = last_run(output_dir)
    assert last["tracking"]["complete"] is True, last["tracking"]
    assert last["tracking"]["run_id"] == parent.info.run_id
    tags, params, metrics = parent.data.tags, parent.data.params, parent.data.metrics
    # Tags: MLflow's source tags and git state, pipeline, TFX run id, MLMD execution ids,
    # versions, device, strategy.
    assert tags["mlflow.user"] and tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.source.name"]
    assert len(tags["mlflow.source.git.commit"]) == 40 and tags["fullthrottle.git_dirty"] in (
        "true",
        "false",
    )
    assert tags["fullthrottle.pipeline_name"] == "fullthrottle-penguins"
    assert tags["fullthrottle.tfx_run_id"] == last["run_id"]
    assert tags["fullthrottle.execution_id.Trainer"] == str(
        last["components"]["Trainer"]["execution_id"]
    )
    assert tags["fullthrottle.version.tensorflow"].startswith("2.")
    assert tags["fullthrottle.device"] and tags["fullthrottle.strategy"]
    # Params: the resolved config that applies to a local run, flattened, plus derived values;
    # no Kubeflow section, no unset field written as 'None'.
    assert params["training.train_steps"] == str(STEPS_A)
    assert params["pipeline_name"] == "fullthrottle-penguins"
    assert not [k for k in params if k.startswith("kubeflow.")]
    assert "None" not in params.values()
    assert len(params) < 110, len(params)  # 175 with the Kubeflow section and the 'None's
    training = last["training"]
    assert params["derived.global_batch_size"] == str(training["global_batch_size"])
    assert params["derived.num_replicas"] == str(training["num_replicas"])
    assert params["derived.precision_policy"] == training["precision_policy"]
    assert float(params["derived.scaled_learning_rate"]) == pytest.approx(training["learning_rate"])
    # Metrics, grouped: evaluator/, train/, eval/, rows/, anomalies/, seconds/.
    assert metrics["evaluator/sparse_categorical_accuracy"] == pytest.approx(
        last["eval_metrics"]["sparse_categorical_accuracy"]
    )
    assert metrics["train/examples_per_second"] > 0 and metrics["eval/accuracy"] > 0
    assert metrics["rows/train"] + metrics["rows/eval"] == 344
    assert "anomalies/train" in metrics and "anomalies/eval" in metrics
    assert all("/" in key and "." not in key.split("/")[0] for key in metrics), sorted(metrics)
    # The training and eval data as MLflow datasets: ExampleGen's splits, digest and source.
    datasets = {d.dataset.name: d for d in parent.inputs.dataset_inputs}
    assert set(datasets) == {"train", "eval"}
    for name, context in (("train", "training"), ("eval", "evaluation")):
        dataset = datasets[name].dataset
        assert {t.key: t.value for t in datasets[name].tags}["mlflow.data.context"] == context
        assert len(dataset.digest) == 16 and dataset.source_type == "local"
        assert json.loads(dataset.source)["uri"].endswith(f"Split-{name}")
        assert "bill_length_mm" in dataset.schema
    assert datasets["train"].dataset.digest != datasets["eval"].dataset.digest
    rows = {n: json.loads(d.dataset.profile)["num_rows"] for n, d in datasets.items()}
    assert rows == {"train": metrics["rows/train"], "eval": metrics["rows/eval"]}
    # System metrics next to the training metrics, on the Trainer run.
    (trainer,) = _children(client, parent, "Trainer")
    assert any(k.startswith("system/cpu_utilization") for k in trainer.data.metrics)
    assert any(k.startswith("system/system_memory") for k in trainer.data.metrics)
    for component in ("Transform", "Evaluator"):
        assert len(_children(client, parent, component)) == 1, component
    # Artifacts: TFDV's statistics, anomalies and schema views as HTML pages.
    top = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"schema", "anomalies", "data", "tensorboard", "last_run.json"} <= top, top
    pages = {a.path for a in client.list_artifacts(parent.info.run_id, "data")}
    assert pages == {"data/statistics.html", "data/anomalies.html", "data/schema.html"}
    statistics = client.download_artifacts(
        parent.info.run_id, "data/statistics.html", str(tmp_path)
    )
    html = Path(statistics).read_text()
    # Facets Overview of both splits: its input is the statistics proto, base64-encoded.
    encoded = re.search(r'<facets-overview proto-input="([^"]+)"', html).group(1)
    shown = statistics_pb2.DatasetFeatureStatisticsList.FromString(base64.b64decode(encoded))
    assert [d.name for d in shown.datasets] == ["train", "eval"]
    assert sum(d.num_examples for d in shown.datasets) == 344
    # The pushed model: an MLflow 3 logged model of the run, registered from it; logging it
    # warned about nothing (no CloudPickle, no `Any` type hint, an input example given).
    _, result = run_a
    assert not re.findall(r"WARNING mlflow\S*:.*", result.stderr), result.stderr[-3000:]
    model_id = last["tracking"]["model_id"]
    assert [o.model_id for o in parent.outputs.model_outputs] == [model_id]
    logged = client.get_logged_model(model_id)
    assert logged.source_run_id == parent.info.run_id
    assert logged.status == LoggedModelStatus.READY
    # Registry: the pushed model, its serving path and push version; the alias on it.
    versions = client.search_model_versions("name = 'penguins'")
    assert len(versions) == 1
    version = versions[0]
    assert version.run_id == parent.info.run_id
    assert version.source == f"models:/{model_id}"
    assert version.tags["serving_path"] == last["pushed_model_dir"]
    assert version.tags["push_version"] == last["pushed_version"]
    assert client.get_model_version_by_alias("penguins", "champion").version == version.version


def test_logged_model_answers_like_the_pushed_model(
    server, output_dir, run_a, monkeypatch, tmp_path
):
    import mlflow.pyfunc
    import numpy as np
    import pandas as pd
    import tensorflow as tf

    monkeypatch.setenv(
        "MLFLOW_TRACKING_URI", server.uri
    )  # mlflow-artifacts: URIs resolve through it
    downloaded = tmp_path / "downloaded"  # not a temp folder MLflow would leave behind
    downloaded.mkdir()
    # The registered model, as a user would name it: its alias.
    model = mlflow.pyfunc.load_model("models:/penguins@champion", dst_path=str(downloaded))
    assert model.metadata.model_id == last_run(output_dir)["tracking"]["model_id"]
    names = [c.name for c in model.metadata.get_input_schema().inputs]
    assert set(names) == {
        "bill_length_mm",
        "bill_depth_mm",
        "flipper_length_mm",
        "body_mass_g",
        "island",
        "sex",
    }
    # What pandas makes of penguins.csv: float64 decimals, int64 whole numbers, strings.
    rows = pd.DataFrame(
        {"bill_length_mm": [39.1, 46.5], "bill_depth_mm": [18.7, 15.0], "flipper_length_mm": [181, 220],
         "body_mass_g": [3750, 5200], "island": ["Torgersen", "Biscoe"], "sex": ["male", "female"]}
    )  # fmt: skip
    answer = model.predict(rows)
    pushed = tf.saved_model.load(last_run(output_dir)["pushed_model_dir"]).signatures["predict_raw"]
    specs = pushed.structured_input_signature[1]
    direct = pushed(
        **{
            c: tf.constant(
                rows[c]
                .to_numpy()
                .astype(object if spec.dtype == tf.string else spec.dtype.as_numpy_dtype)
            )
            for c, spec in specs.items()
        }
    )
    np.testing.assert_allclose(
        np.stack(answer["probabilities"]), direct["probabilities"].numpy(), rtol=1e-6
    )
    # Class names as text, the model's own choice.
    assert list(answer["class"]) == [c.decode() for c in direct["classes"].numpy()]
    assert set(answer["class"]) <= set(model.metadata.metadata["classes"])


def test_compare_shows_differing_params_and_writes_chart(server, output_dir, run_a, tmp_path):
    result = run_cli(
        "run", "--output-dir", str(output_dir), "--set", f"training.train_steps={STEPS_B}",
        "--set", "training.learning_rate=0.003", *COMMON, "--set", "tracking.points_per_curve=100",
        env={"MLFLOW_TRACKING_URI": server.uri},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-5000:]
    # About 100 points per curve: 120 loops of 25 steps, a point in each 30-step span.
    client = MlflowClient(server.uri)
    newest = sorted(_parent_runs(client), key=lambda r: r.info.start_time)[-1]
    (trainer,) = _children(client, newest, "Trainer")
    loss = client.get_metric_history(trainer.info.run_id, "train/loss")
    assert len(loss) == 100, len(loss)
    assert max(m.step for m in loss) == STEPS_B
    chart = tmp_path / "compare.png"
    result = run_cli(
        "compare", "--last", "2", "--output-dir", str(output_dir), "--chart", str(chart),
        env={"MLFLOW_TRACKING_URI": server.uri},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = {
        line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line.strip()
    }
    assert lines["training.learning_rate"] == ["0.001", "0.003"]
    assert lines["training.train_steps"] == [str(STEPS_A), str(STEPS_B)]
    assert "training.seed" not in lines, "identical params must not be listed"
    assert len(lines["accuracy"]) == 2 and len(lines["examples/s"]) == 2
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 10_000


def test_tracking_server_down_during_training_does_not_stop_the_run(output_dir, tmp_path):
    doomed = MlflowServer(tmp_path / "doomed_server")
    log = tmp_path / "run_c.log"
    try:
        process = _start_cli(
            "run", "--output-dir", str(output_dir), "--set", "training.train_steps=900",
            "--set", "tracking.retries=1", "--set", "tracking.retry_backoff_seconds=0.2",
            "--set", "tracking.request_timeout_seconds=5", "--set", "tracking.flush_timeout_seconds=10",
            *COMMON, uri=doomed.uri, log=log,
        )  # fmt: skip
        _wait_for_checkpoint(process, output_dir, at_least=200, log=log)
    finally:
        doomed.stop()
    assert process.wait(timeout=900) == 0, log.read_text()[-5000:]
    last = last_run(output_dir)
    assert last["training"]["steps_completed"] == 900
    assert last["pushed_model_dir"] and Path(last["pushed_model_dir"], "saved_model.pb").exists()
    assert last["tracking"]["complete"] is False
    assert last["tracking"]["failures"]
    assert "MLflow tracking is INCOMPLETE" in log.read_text()
