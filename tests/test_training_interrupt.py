"""Training stops on a real signal at the next loop end with a checkpoint at that step, and a
damaged newest checkpoint is set aside for the one before it (in process, through `train()`)."""

from __future__ import annotations

import glob
import os
import signal

import pytest

from tests.training_data import feature_spec, tabular_inputs, write_records
from trainer_module.training import TrainingConfig, TrainingHook, train
from trainer_module.training.checkpoints import (
    UNREADABLE_DIR,
    checkpoint_candidates,
    unreadable_reason,
)
from trainer_module.training.errors import CheckpointUnreadableError, TrainingInterrupted


def _config(**overrides) -> TrainingConfig:
    base = {
        "per_replica_batch_size": 16,
        "train_steps": 40,
        "steps_per_loop": 5,
        "checkpoint_every_steps": 10,
        "checkpoints_to_keep": 3,
        "precision": "float32",
        "models": {"tabular": {"hidden_units": [8]}},
        "num_logical_cpu_devices": 0,
    }
    return TrainingConfig(**{**base, **overrides})


class SignalAt(TrainingHook):
    """Sends ``signum`` to this process after the loop that ends at ``step``: a real signal,
    taken by the handler `train()` installs."""

    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum = step, signum
        self.interrupted: tuple[int, str | None] | None = None
        self.ended = False

    def on_loop_end(self, step, record):
        if step == self.step:
            os.kill(os.getpid(), self.signum)

    def on_interrupt(self, step, checkpoint):
        self.interrupted = (step, checkpoint)

    def on_train_end(self, result):
        self.ended = True


def _train(tmp_path, config, hooks=()):
    inputs = tabular_inputs()
    files = sorted(glob.glob(str(tmp_path / "data" / "*")))
    if not files:
        files = write_records(tmp_path / "data", inputs, files=1, per_file=128)
    return train(
        config=config,
        model_inputs=inputs,
        feature_spec=feature_spec(inputs),
        train_files=files,
        eval_files=[],
        work_dir=str(tmp_path / "work"),
        hooks=hooks,
    )


@pytest.fixture
def restore_signal_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_a_signal_stops_at_the_loop_end_with_a_checkpoint_there(tmp_path, restore_signal_handlers):
    ckpt_dir = tmp_path / "work" / "checkpoints"
    # SIGTERM after the loop ending at step 15 (between the periodic saves at 10 and 20).
    hook = SignalAt(15, signal.SIGTERM)
    with pytest.raises(TrainingInterrupted) as stopped:
        _train(tmp_path, _config(), hooks=[hook])
    assert stopped.value.signum == signal.SIGTERM
    assert stopped.value.step == 15
    assert stopped.value.checkpoint and stopped.value.checkpoint.endswith("ckpt-15")
    assert hook.interrupted == (15, stopped.value.checkpoint) and not hook.ended
    assert checkpoint_candidates(str(ckpt_dir))[0].endswith("ckpt-15")
    # The first signal made the next one abort at once (the kernel's default action).
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL
    signal.signal(signal.SIGINT, signal.default_int_handler)

    # SIGINT on the resumed run: its own step, then the rerun finishes the same 40 steps.
    hook = SignalAt(25, signal.SIGINT)
    with pytest.raises(TrainingInterrupted) as stopped:
        _train(tmp_path, _config(), hooks=[hook])
    assert (stopped.value.signum, stopped.value.step) == (signal.SIGINT, 25)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    result = _train(tmp_path, _config())
    assert result.facts.start_step == 25
    assert result.steps_completed == 40
    # Without a signal the handlers before train() are back.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _damage(prefix: str, how: str) -> None:
    data = max(glob.glob(prefix + ".data-*"), key=os.path.getsize)  # the shard with the weights
    size = os.path.getsize(data)
    if how == "truncate":
        os.truncate(data, size // 2)
    else:
        with open(data, "r+b") as f:
            f.seek(size // 3)
            f.write(os.urandom(max(16, size // 3)))


@pytest.mark.parametrize("how", ["truncate", "garbage"])
def test_a_damaged_newest_checkpoint_is_set_aside_for_the_previous_one(tmp_path, how):
    ckpt_dir = tmp_path / "work" / "checkpoints"
    _train(tmp_path, _config(train_steps=30))
    newest = checkpoint_candidates(str(ckpt_dir))[0]
    assert newest.endswith("ckpt-30")
    _damage(newest, how)

    result = _train(tmp_path, _config(train_steps=40))
    assert result.facts.start_step == 20
    assert result.steps_completed == 40
    assert result.facts.unreadable_checkpoints == (newest,)
    aside = sorted(os.listdir(ckpt_dir / UNREADABLE_DIR))
    assert aside and all(name.startswith("ckpt-30.") for name in aside)
    # The rerun saved a new, readable ckpt-30 in its place.
    assert unreadable_reason(str(ckpt_dir / "ckpt-30")) is None


def test_no_readable_checkpoint_stops_unless_asked_to_start_over(tmp_path):
    ckpt_dir = tmp_path / "work" / "checkpoints"
    _train(tmp_path, _config(train_steps=20, checkpoints_to_keep=1))
    (only,) = checkpoint_candidates(str(ckpt_dir))
    _damage(only, "truncate")
    with pytest.raises(CheckpointUnreadableError, match="none of the checkpoints") as refused:
        _train(tmp_path, _config(train_steps=30))
    assert "start_over" in str(refused.value) and str(ckpt_dir) in str(refused.value)
    assert checkpoint_candidates(str(ckpt_dir)) == [only]  # left for the user to decide
    result = _train(tmp_path, _config(train_steps=30, unreadable_checkpoints="start_over"))
    assert result.facts.start_step == 0 and result.steps_completed == 30


SECOND_SIGNAL = """
import signal, sys, time
from trainer_module.training.interrupt import StopBetweenLoops
with StopBetweenLoops() as stop:
    signal.raise_signal(signal.SIGINT)  # the first: only recorded
    print("recorded", stop.signum, flush=True)
    time.sleep(60)  # stands for a long checkpoint write: the second signal must not wait for it
print("not aborted", flush=True)
"""


def test_a_second_signal_ends_the_process_at_once(tmp_path):
    import subprocess
    import sys
    import time

    from tests.helpers import REPO

    proc = subprocess.Popen(
        [sys.executable, "-c", SECOND_SIGNAL],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
    )
    assert proc.stdout.readline().strip() == f"recorded {int(signal.SIGINT)}"
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGINT  # ended by the signal itself, not by Python
    assert time.monotonic() - sent < 5
    assert "not aborted" not in proc.stdout.read()
