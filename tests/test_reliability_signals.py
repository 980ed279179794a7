"""SIGINT and SIGTERM during the real `fullthrottle run`, and two runs on one folder.

One campaign (a module fixture) on the bundled penguins data, in one output folder, with a copy of
the project's files (an edit to the working tree mid-campaign would change the Trainer's cache
key and checkpoint folder):

1. two runs started together on the folder: exactly one proceeds, the other exits 2 at once
   naming the holder;
2. the one that proceeds gets SIGINT (to its process group) at a random moment of training;
3. the rerun resumes at that step and gets SIGTERM (steps 2-3 are repeated on further reruns
   with FULLTHROTTLE_SIGNAL_ROUNDS > 1; MLflow's statuses are read after each stop);
4. the newest checkpoint (the one SIGTERM wrote) is cut in half; the last rerun resumes from the
   one before it and trains to the end.

Training takes `TRAIN_STEPS` steps with periodic checkpoints only at `CHECKPOINT_EVERY` (so a
checkpoint at any other step is the signal's). Timings are printed with ``pytest -s``.
"""

from __future__ import annotations

import glob
import os
import random
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import CliProcess, committed_checkpoint_step, last_run, snapshot_code

pytestmark = [
    pytest.mark.slow,
    # MLflow's own SQLAlchemy store, read directly here (third-party code we cannot change).
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning"),
]

TRAIN_STEPS = 20_000
CHECKPOINT_EVERY = 15_000
RUN_ARGS = (
    "--set",
    f"training.train_steps={TRAIN_STEPS}",
    "--set",
    f"training.checkpoint_every_steps={CHECKPOINT_EVERY}",
    "--set",
    "training.steps_per_loop=10",
)
TIMEOUT_SECONDS = 420
# Rounds of (SIGINT, SIGTERM), each on a rerun of the one before; FULLTHROTTLE_SIGNAL_ROUNDS=5
# gives the five of each (each extra round took about a minute more here).
ROUNDS = int(os.environ.get("FULLTHROTTLE_SIGNAL_ROUNDS", "1"))
_START = re.compile(r"\[trainer\] start step (\d+)/(\d+)")
_STOPPED = re.compile(r"interrupted by (SIG\w+) during Trainer at step (\d+)")


class Run(CliProcess):
    """One `fullthrottle run` of the campaign on ``output_dir``."""

    def __init__(self, output_dir: Path, code: Path) -> None:
        super().__init__("run", "--output-dir", str(output_dir), *RUN_ARGS, code=code)

    def wait_for(self, pattern: str, *, poll: float = 0.02) -> re.Match:
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while True:
            for line in list(self.lines):
                if m := re.search(pattern, line):
                    return m
            if self.proc.poll() is not None:
                self._reader.join(timeout=10)
                pytest.fail(
                    f"the run ended ({self.proc.returncode}) before {pattern!r}:\n{self.text[-5000:]}"
                )
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"timed out waiting for {pattern!r}:\n{self.text[-5000:]}")
            time.sleep(poll)

    def signal(self, signum: int) -> tuple[float, float]:
        """Sends ``signum`` to the run's process group; seconds until training stopped (its
        checkpoint written) and until the process exited."""
        sent = time.monotonic()
        os.killpg(self.proc.pid, signum)  # pgid == pid: start_new_session=True
        self.finish()
        exited = time.monotonic() - sent
        self.after_signal = [
            f"+{t - sent:.2f}s {line[:120]}"
            for t, line in zip(self.times, self.lines, strict=False)
            if t >= sent
        ]
        stopped = next(
            (
                t - sent
                for t, line in zip(self.times, self.lines, strict=False)
                if "[trainer] stopped" in line
            ),
            -1.0,
        )
        return stopped, exited

    def finish(self, timeout: float = TIMEOUT_SECONDS) -> int:
        return super().finish(timeout)


@dataclass
class Stop:
    signum: int
    exit_status: int
    seconds_to_exit: float
    seconds_to_stop: float  # to the Trainer's "stopped at step" line (checkpoint written)
    step: int  # from the message
    committed: int  # the newest checkpoint the state file names, after the exit
    summary: dict
    text: str
    resumed_from: int | None = None  # this run's own start step
    mlflow: tuple[str, str] = ("", "")  # statuses of the pipeline run and the Trainer run then


@dataclass
class Campaign:
    output_dir: Path
    pipeline_root: Path
    refused: dict = field(default_factory=dict)
    stops: list[Stop] = field(default_factory=list)
    damaged: str = ""
    final_start: int = -1
    final_exit: int = -1
    final_text: str = ""
    final_summary: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"[signals] {text}", flush=True)


def _mlflow_statuses(summary: dict) -> tuple[str, str]:
    """Statuses of the pipeline run and of its Trainer run, read from MLflow's store now."""
    from mlflow.tracking import MlflowClient

    tracking = summary.get("tracking") or {}
    if not tracking.get("run_id"):
        return ("", "")
    client = MlflowClient(tracking["uri"])
    parent = client.get_run(tracking["run_id"])
    trainers = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and "
        "tags.`fullthrottle.component` = 'Trainer'",
    )
    return parent.info.status, ",".join(t.info.status for t in trainers)


def _stop_in_training(c: Campaign, run: Run, signum: int, rng: random.Random) -> Stop:
    start = int(run.wait_for(_START.pattern).group(1))
    run.wait_for(r"\[trainer\] step \d+")  # the first loop ran (traced and compiled)
    time.sleep(rng.uniform(0.2, 1.5))
    to_stop, seconds = run.signal(signum)
    text = run.text
    match = _STOPPED.search(text)
    step = int(match.group(2)) if match else -1
    stop = Stop(
        signum=signum,
        exit_status=run.proc.returncode,
        seconds_to_exit=seconds,
        seconds_to_stop=to_stop,
        step=step,
        committed=committed_checkpoint_step(c.pipeline_root),
        summary=last_run(c.output_dir) if (c.output_dir / "last_run.json").exists() else {},
        text=text,
        resumed_from=start,
    )
    stop.mlflow = _mlflow_statuses(stop.summary)
    c.note("after the signal:\n  " + "\n  ".join(run.after_signal))
    c.note(
        f"{signal.Signals(signum).name}: started at step {start}, stopped at {step}, "
        f"newest checkpoint {stop.committed}, training stopped {to_stop:.2f} s and the process exited ({stop.exit_status}) "
        f"{seconds:.1f} s after the signal"
    )
    return stop


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> Campaign:
    output_dir = tmp_path_factory.mktemp("signals")
    c = Campaign(
        output_dir=output_dir, pipeline_root=output_dir / "pipeline_root" / "fullthrottle-penguins"
    )
    seed = int(os.environ.get("FULLTHROTTLE_SIGNAL_SEED", random.SystemRandom().randrange(10**6)))
    rng = random.Random(seed)
    c.note(f"seed {seed} (FULLTHROTTLE_SIGNAL_SEED replays the same signal moments)")
    code = snapshot_code(tmp_path_factory.mktemp("signals-code"))

    # 1. Two runs within a second on one folder.
    first, second = Run(output_dir, code), Run(output_dir, code)
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while first.proc.poll() is None and second.proc.poll() is None:
        assert time.monotonic() < deadline, first.text + second.text
        time.sleep(0.05)
    loser, winner = (first, second) if first.proc.poll() is not None else (second, first)
    loser.finish()
    c.refused = {
        "exit": loser.proc.returncode,
        "seconds": time.monotonic() - loser.started,
        "text": loser.text,
        "winner_pid": winner.proc.pid,
        "winner_running": winner.proc.poll() is None,
    }
    c.note(f"second run refused: exit {loser.proc.returncode} after {c.refused['seconds']:.1f} s")

    # 2-3. SIGINT, then SIGTERM on the rerun (ROUNDS times), each run the rerun of the one before.
    signals = [signal.SIGINT, signal.SIGTERM] * ROUNDS
    for i, signum in enumerate(signals):
        run = winner if i == 0 else Run(output_dir, code)
        c.stops.append(_stop_in_training(c, run, signum, rng))

    # 4. Cut the newest checkpoint's data in half; the last run resumes from the one before.
    newest = c.stops[-1].summary.get("interrupted", {}).get("checkpoint") or ""
    data = glob.glob(newest + ".data-*")
    if data:
        biggest = max(data, key=os.path.getsize)
        os.truncate(biggest, os.path.getsize(biggest) // 2)
        c.damaged = newest
    final = Run(output_dir, code)
    c.final_exit = final.finish()
    c.final_text = final.text
    match = _START.search(final.text)
    c.final_start = int(match.group(1)) if match else -1
    c.final_summary = last_run(output_dir)
    c.note(
        f"damaged {os.path.basename(newest)}; last run started at {c.final_start}, exit {c.final_exit}"
    )
    return c


def test_two_runs_on_one_folder_exactly_one_proceeds(campaign):
    refused = campaign.refused
    assert refused["winner_running"], "the run that took the lock ended with the refused one"
    assert refused["exit"] == 2, refused["text"][-3000:]
    assert "another run is using the output folder" in refused["text"]
    assert f"pid {refused['winner_pid']}" in refused["text"]
    assert str(campaign.output_dir.resolve()) in refused["text"].replace("\n", "")
    assert "Traceback" not in refused["text"]


def test_each_signal_in_training_saves_its_step_and_says_how_to_resume(campaign):
    assert [s.signum for s in campaign.stops] == [signal.SIGINT, signal.SIGTERM] * ROUNDS
    for stop in campaign.stops:
        name = signal.Signals(stop.signum).name
        status = 128 + stop.signum
        assert stop.exit_status == status, stop.text[-5000:]
        assert 0 <= stop.seconds_to_stop < 5
        assert stop.seconds_to_exit < 15
        assert f"interrupted by {name} during Trainer at step {stop.step}" in stop.text
        assert 0 < stop.step < TRAIN_STEPS and stop.step % CHECKPOINT_EVERY != 0
        # The checkpoint at the signal's step is the newest committed one.
        assert stop.committed == stop.step
        assert "Resume with: fullthrottle run --output-dir" in stop.text
        assert "Traceback" not in stop.text
        interrupted = stop.summary["interrupted"]
        assert stop.summary["status"] == "interrupted"
        assert interrupted["signal"] == name and interrupted["exit_status"] == status
        assert interrupted["component"] == "Trainer" and interrupted["step"] == stop.step
        assert interrupted["checkpoint"].endswith(f"ckpt-{stop.step}")
        assert stop.summary["pushed_model_dir"] is None
        # MLflow, right after the stop: the pipeline run and the Trainer run are KILLED.
        assert stop.mlflow == ("KILLED", "KILLED")


def test_each_rerun_starts_at_the_step_the_signal_saved(campaign):
    starts = [s.resumed_from for s in campaign.stops]
    assert starts == [0] + [s.step for s in campaign.stops[:-1]]


def test_a_damaged_newest_checkpoint_is_skipped_and_the_run_finishes(campaign):
    before, last = campaign.stops[-2:]
    assert campaign.damaged.endswith(f"ckpt-{last.step}")
    assert campaign.final_exit in (0, 3), campaign.final_text[-5000:]
    # The checkpoint before the damaged one: the previous signal's.
    assert campaign.final_start == before.step
    assert f"checkpoint {campaign.damaged} is unreadable" in campaign.final_text
    # (The folder it was moved to went with the checkpoints once the model was exported; the
    # move itself is tests/test_training_interrupt.py's.)
    assert campaign.final_summary["status"] == "succeeded"
    assert campaign.final_summary["training"]["steps_completed"] == TRAIN_STEPS


def test_mlflow_keeps_one_parent_run_killed_then_reattached(campaign):
    from mlflow.tracking import MlflowClient

    ids = [s.summary["tracking"]["run_id"] for s in campaign.stops]
    ids.append(campaign.final_summary["tracking"]["run_id"])
    assert ids[0] and len(set(ids)) == 1
    assert all(s.summary["tracking"]["reattached"] for s in campaign.stops[1:])
    client = MlflowClient(campaign.final_summary["tracking"]["uri"])
    parent = client.get_run(ids[0])
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["fullthrottle.attempts"] == str(len(campaign.stops) + 1)
    assert parent.data.tags["fullthrottle.interrupted_by"] == "SIGTERM"  # the last signal
    trainers = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{ids[0]}' and "
        "tags.`fullthrottle.component` = 'Trainer'",
    )
    assert len(trainers) == 1
    trainer = trainers[0]
    assert trainer.info.status == "FINISHED"
    assert trainer.data.tags["fullthrottle.unreadable_checkpoints"] == campaign.damaged
    # No step twice in the loss curve.
    steps = [m.step for m in client.get_metric_history(trainer.info.run_id, "train/loss")]
    assert sorted(steps) == sorted(set(steps))
