"""A run killed with SIGKILL mid-training and restarted ends exactly where an uninterrupted
run ends: same step count and (op determinism on) the same weights.

Resume is exact because the checkpoint holds model, optimizer slots, the optimizer's
iteration count (which the LR schedule reads) and the global step, and the input pipeline is
replayed in its seeded order and the already-trained batches skipped (`resume_data="skip"`).
"""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

from tests.training_data import tabular_inputs, write_records
from tests.training_procs import finish, spawn, tail

pytestmark = pytest.mark.slow

TRAIN_STEPS = 60


def _spec(tmp_path, data, name, **extra):
    return {
        "config": {
            "per_replica_batch_size": 16,
            "train_steps": TRAIN_STEPS,
            "steps_per_loop": 5,
            "checkpoint_every_steps": 10,
            "precision": "float32",
            "warmup_steps": 20,  # the LR schedule position must survive the restart too
            "models": {"tabular": {"hidden_units": [16]}},
            "dropout_rate": 0.1,  # dropout RNG state is restored as well
            "deterministic": True,
        },
        "data_dir": str(data),
        "work_dir": str(tmp_path / name),
        "result": str(tmp_path / f"{name}.json"),
        **extra,
    }


def test_sigkill_then_restart_matches_uninterrupted_run(tmp_path):
    inputs = tabular_inputs()
    data = tmp_path / "data"
    write_records(data / "train", inputs, files=3, per_file=128)  # several epochs in 60 steps
    progress = tmp_path / "progress.txt"

    reference = spawn(_spec(tmp_path, data, "reference"), tmp_path / "reference-spec.json")
    # Slow (0.5 s per 5-step loop) so there is time to kill it between checkpoints.
    victim = spawn(
        _spec(tmp_path, data, "victim", progress=str(progress), loop_sleep=0.5),
        tmp_path / "victim-spec.json",
    )
    deadline = time.monotonic() + 180
    killed_after = None
    while time.monotonic() < deadline and victim.poll() is None:
        steps = [int(s) for s in progress.read_text().split()] if progress.exists() else []
        if steps and steps[-1] >= 20:
            time.sleep(0.7)  # land mid-loop, after more steps than the checkpoint holds
            os.kill(victim.pid, signal.SIGKILL)
            killed_after = steps[-1]
            break
        time.sleep(0.05)
    victim_log = finish(victim, timeout=30)
    assert killed_after is not None, "victim never reached a checkpoint:\n" + tail(victim_log)
    assert victim.returncode == -signal.SIGKILL, tail(victim_log)
    assert not (tmp_path / "victim.json").exists()  # it really died before finishing

    restart = spawn(_spec(tmp_path, data, "victim"), tmp_path / "restart-spec.json")
    for proc in (restart, reference):
        log = finish(proc, timeout=240)
        assert proc.returncode == 0, tail(log)

    ref = json.loads((tmp_path / "reference.json").read_text())
    res = json.loads((tmp_path / "victim.json").read_text())
    assert 20 <= res["start_step"] < TRAIN_STEPS
    assert res["steps_completed"] == ref["steps_completed"] == TRAIN_STEPS
    # Same ops on the same data in the same order with determinism enabled: the weights are
    # expected to be identical; 1e-6 absolute allows only for harmless last-bit differences.
    wr, wv = np.load(ref["weights"]), np.load(res["weights"])
    for k in wr.files:
        np.testing.assert_allclose(wv[k], wr[k], rtol=0, atol=1e-6)
    assert res["final_loss"] == pytest.approx(ref["final_loss"], rel=1e-6)
