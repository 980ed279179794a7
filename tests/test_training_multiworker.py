"""Two local processes train with MultiWorkerMirroredStrategy (TF_CONFIG on 127.0.0.1).

Checks: both see 2 workers / 2 replicas, end on the same step with the same loss and the
same weights (synchronous data parallelism keeps them in sync), and only the chief exports,
writes TensorBoard events and keeps checkpoints in work_dir (the other worker checkpoints to a
temporary directory outside work_dir that is removed at the end).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from tests.training_data import tabular_inputs, write_records
from tests.training_procs import finish, free_ports, spawn, tail

pytestmark = pytest.mark.slow


def test_two_workers_stay_in_sync_and_only_chief_exports(tmp_path):
    inputs = tabular_inputs()
    data = tmp_path / "data"
    write_records(data / "train", inputs, files=4, per_file=128)
    write_records(data / "eval", inputs, files=2, per_file=64, seed=1)
    work_dir = tmp_path / "work"  # shared, as a GCS/NFS model dir would be
    export_dir = tmp_path / "export"
    config = {
        "per_replica_batch_size": 16,
        "train_steps": 20,
        "steps_per_loop": 5,
        "checkpoint_every_steps": 10,
        "precision": "float32",
        "dropout_rate": 0.0,
        "models": {"tabular": {"hidden_units": [16]}},
        "deterministic_input": True,
    }
    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    procs = []
    for task_type in ("chief", "worker"):
        spec = {
            "config": config,
            "data_dir": str(data),
            "work_dir": str(work_dir),
            "export_dir": str(export_dir),
            "result": str(tmp_path / f"{task_type}.json"),
        }
        tf_config = {"cluster": cluster, "task": {"type": task_type, "index": 0}}
        procs.append(spawn(spec, tmp_path / f"{task_type}-spec.json", tf_config=tf_config))
    logs = [finish(p, timeout=240) for p in procs]
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, tail(log)

    chief = json.loads((tmp_path / "chief.json").read_text())
    worker = json.loads((tmp_path / "worker.json").read_text())
    for r in (chief, worker):
        assert r["strategy_name"] == "MultiWorkerMirroredStrategy"
        assert r["num_workers"] == 2 and r["num_replicas"] == 2
        assert r["steps_completed"] == 20
    assert chief["is_chief"] and not worker["is_chief"]

    # In sync: the loss is all-reduced and every update applies the same all-reduced gradient,
    # so both processes hold bit-identical weights (tolerance only for safety: 1e-6).
    assert chief["losses"] == pytest.approx(worker["losses"], rel=1e-6)
    wc, ww = np.load(chief["weights"]), np.load(worker["weights"])
    assert len(wc.files) == len(ww.files)
    for k in wc.files:
        np.testing.assert_allclose(wc[k], ww[k], rtol=0, atol=1e-6)
    assert chief["losses"][-1] < chief["losses"][0]
    assert chief["eval_metrics"]["examples"] == pytest.approx(128)  # 2 files x 64, once

    # Only the chief exports.
    assert worker["serving_model_is_none"] and worker["exported"] is None
    assert not chief["serving_model_is_none"] and chief["exported"]
    assert os.listdir(export_dir) == [os.path.basename(chief["exported"])]
    # Only the chief writes TensorBoard events (event file names end in .<pid>.<n>.v2).
    events = os.listdir(work_dir / "logs" / "train")
    assert events and all(re.search(rf"\.{chief['pid']}\.\d+\.v2$", e) for e in events), events
    # The chief keeps checkpoints in work_dir; the worker's went to its own temp dir, outside
    # work_dir, which is gone now.
    assert chief["checkpoint_dir"] == str(work_dir / "checkpoints")
    assert os.path.exists(work_dir / "checkpoints" / "ckpt-20.index")
    # (A path check, not a string prefix: the worker's temp dir is tmp_path/worker-spec-tmp/...,
    # a sibling of tmp_path/work whose name starts with "work".)
    assert not Path(worker["checkpoint_dir"]).is_relative_to(work_dir)
    assert not os.path.exists(worker["checkpoint_dir"])


def test_a_signal_to_one_worker_stops_both_at_the_same_step_with_a_checkpoint(tmp_path):
    """SIGTERM reaches the non-chief worker only (as when one pod is preempted): both agree, by
    the all-reduce between loops, to stop after the same loop; the chief keeps its checkpoint."""
    import signal
    import time

    inputs = tabular_inputs()
    data = tmp_path / "data"
    write_records(data / "train", inputs, files=2, per_file=128)
    work_dir = tmp_path / "work"
    progress = tmp_path / "progress.txt"
    config = {
        "per_replica_batch_size": 16,
        "train_steps": 400,
        "steps_per_loop": 5,
        "checkpoint_every_steps": 10,
        "precision": "float32",
        "models": {"tabular": {"hidden_units": [8]}},
    }
    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    procs = {}
    for task_type in ("chief", "worker"):
        spec = {
            "config": config,
            "data_dir": str(data),
            "work_dir": str(work_dir),
            "result": str(tmp_path / f"{task_type}.json"),
            # The chief (which runs the hooks) sleeps after each loop: the worker waits for it
            # in the next loop's collectives, so the run is slow enough to signal mid-way.
            "loop_sleep": 0.1,
            "progress": str(progress),
        }
        tf_config = {"cluster": cluster, "task": {"type": task_type, "index": 0}}
        procs[task_type] = spawn(spec, tmp_path / f"{task_type}-spec.json", tf_config=tf_config)
    deadline = time.monotonic() + 180
    while not (progress.exists() and progress.read_text().split()):
        assert time.monotonic() < deadline and procs["chief"].poll() is None, tail(
            procs["chief"].log_path.read_text()
        )
        time.sleep(0.05)
    os.kill(procs["worker"].pid, signal.SIGTERM)
    logs = {name: finish(p, timeout=120) for name, p in procs.items()}
    for name, p in procs.items():
        assert p.returncode == 0, tail(logs[name])
    chief = json.loads((tmp_path / "chief.json").read_text())["interrupted"]
    worker = json.loads((tmp_path / "worker.json").read_text())["interrupted"]
    assert worker["signum"] == signal.SIGTERM and chief["signum"] is None  # told by the worker
    assert chief["step"] == worker["step"]
    assert 10 <= chief["step"] < 400
    assert chief["checkpoint"] == str(work_dir / "checkpoints" / f"ckpt-{chief['step']}")
    assert os.path.exists(chief["checkpoint"] + ".index")
