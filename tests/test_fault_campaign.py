"""One fault campaign: a single output folder and a single `mlflow server` through every way a
real `fullthrottle run` ends early, on the bundled penguins data, real components on real Beam.

The campaign (a module fixture) runs, each on the rerun of the one before:

1. two runs started together on the folder: exactly one proceeds, the other exits 2 at once
   naming the holder;
2. the one that proceeds is SIGKILLed at a random moment of Transform;
3. SIGKILL during the Trainer, soon after a committed checkpoint, `TRAINER_KILLS` times (the step
   is the newest checkpoint that CheckpointManager's state file names);
4. SIGINT, then SIGTERM, to the run's process group at a random moment of training;
5. the newest checkpoint (the one SIGTERM wrote) is cut in half: the rerun resumes from the one
   before it and trains to the end; it and the reruns after it are SIGKILLed at random moments of
   the Pusher's execution, then right after a new version folder appears (published, not yet
   recorded by TFX);
6. a last rerun finishes and pushes.

Every run tracks into the same MLflow server: the campaign is one parent run, re-attached by
each rerun, with one Trainer run whose curves hold every loop's step exactly once. A poller
thread loads every version folder the moment it appears. Kill points are random (the seed is
printed; `FULLTHROTTLE_FAULT_SEED` replays it); where each landed is printed with ``pytest -s``.
After the campaign, two more runs share the folder and server: one with another learning rate
(for `compare`), and one whose tracking server dies mid-training.
"""

from __future__ import annotations

import base64
import contextlib
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from mlflow.entities import LoggedModelStatus
from mlflow.tracking import MlflowClient
from tensorflow_metadata.proto.v0 import statistics_pb2

from fullthrottle.progress import read_component_states
from fullthrottle.tracking.names import RUN_KEY_TAG
from serving.push import version_dirs
from tests.helpers import (
    REPO,
    CliProcess,
    committed_checkpoint_step,
    committed_checkpoint_step_in,
    eval_split_examples,
    last_run,
    snapshot_code,
    strip_label,
)
from tests.tracking_server import MlflowServer

pytestmark = [
    pytest.mark.slow,
    # The campaign (the first test's setup) is about twenty runs of the pipeline.
    pytest.mark.timeout(2400),
    # MLflow's own SQLAlchemy store, read directly here (third-party code we cannot change).
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning"),
]

# Kills are aimed within 60 steps of where a run resumed and land up to ~35 ms after their
# checkpoint; each signal lands 0.2-1.0 s into training (a few hundred steps here). The steps
# left after the last interruption keep the final training short while no interruption can
# reach the last step.
TRAIN_STEPS = 6000
CHECKPOINT_EVERY = 20
STEPS_PER_LOOP = 10
TRAINER_KILLS = 2
PUSHER_RANDOM_KILLS = 4
RUN_ARGS = (
    "--set", f"training.train_steps={TRAIN_STEPS}",
    "--set", f"training.checkpoint_every_steps={CHECKPOINT_EVERY}",
    "--set", f"training.steps_per_loop={STEPS_PER_LOOP}",
    # A point per loop, so every loop's step can be checked across the interruptions; aggregating
    # loops into about 100 points per curve (the default) is checked with the `compare` run.
    "--set", "tracking.points_per_curve=0",
    "--set", "tracking.system_metrics_interval_seconds=1",
)  # fmt: skip
# The Pusher's execution takes a few seconds: its length is measured in the campaign by one push
# of the same model with the same settings, and random kills are drawn over 1.1x that.
PUSHER_WINDOW_MARGIN = 1.1
PHASE_TIMEOUT_SECONDS = 420
PIPELINE = "fullthrottle-penguins"
_RESUMED = re.compile(r"\[trainer\] start step (\d+)/(\d+)")
_STOPPED = re.compile(r"interrupted by (SIG\w+) during Trainer at step (\d+)")
_CURVES = ("train/loss", "train/learning_rate", "train/examples_per_second",
           "train/input_wait_fraction")  # fmt: skip


class PipelineProcess(CliProcess):
    """One `fullthrottle run` of the campaign on ``output_dir``, tracked into ``tracking_uri``."""

    def __init__(self, output_dir: Path, code: Path, tracking_uri: str, *extra: str) -> None:
        # A SIGKILLed run cannot remove its scratch folder: keep it in the test's tmp.
        temp = output_dir.with_name(f"{output_dir.name}-tmp")
        temp.mkdir(parents=True, exist_ok=True)
        super().__init__(
            "run",
            "--output-dir",
            str(output_dir),
            *RUN_ARGS,
            *extra,
            code=code,
            env={"TMPDIR": str(temp), "MLFLOW_TRACKING_URI": tracking_uri},
        )
        self.mlmd_states: dict[str, str] = {}  # after it ended: this run's components in MLMD
        self.started_wall = time.time()

    def wait_until(self, condition, *, what: str, poll: float = 0.005) -> None:
        """Polls `condition()` until true; fails if the process ends first or the time runs out."""
        deadline = time.monotonic() + PHASE_TIMEOUT_SECONDS
        while not condition():
            if self.proc.poll() is not None:
                self._reader.join(timeout=10)
                pytest.fail(
                    f"the run ended (exit {self.proc.returncode}) before {what}:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"timed out waiting for {what}:\n{self.tail()}")
            time.sleep(poll)

    def wait_for_line(self, pattern: str) -> re.Match:
        found: list[re.Match] = []

        def seen() -> bool:
            found.extend(m for line in list(self.lines) if (m := re.search(pattern, line)))
            return bool(found)

        self.wait_until(seen, what=repr(pattern), poll=0.02)
        return found[0]

    def finish(self, timeout: float = PHASE_TIMEOUT_SECONDS) -> int:
        return super().finish(timeout)

    def start_steps(self) -> list[int]:
        return [int(m.group(1)) for line in self.lines if (m := _RESUMED.search(line))]


@dataclass
class Stop:
    """A run stopped by SIGINT or SIGTERM in training."""

    signum: int
    sent_at: float  # wall clock, to compare with the checkpoint's files
    exit_status: int
    seconds_to_exit: float
    seconds_to_stop: float  # to the Trainer's "stopped at step" line (checkpoint written)
    step: int  # from the message
    committed: int  # the newest checkpoint the state file names, after the exit
    checkpoint_written_at: float  # mtime of the committed checkpoint's index file
    summary: dict
    text: str
    resumed_from: int
    mlflow: tuple[str, str]  # statuses of the pipeline run and of its Trainer run then


@dataclass
class PushPoller:
    """Watches the push folder; loads and queries every version folder the moment it appears.

    Owns one thread. Records, per version seen: whether its files were complete at first sight
    and whether it loaded and answered `serving_default` with probabilities summing to 1.
    """

    serving_dir: Path
    examples: list[bytes]
    seen: dict[str, str] = field(default_factory=dict)  # version -> "ok" or what went wrong
    polls: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="push-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.polls += 1
            for name in _entries(self.serving_dir):
                if name.isdigit() and name not in self.seen:
                    self.seen[name] = self._check(self.serving_dir / name)
            time.sleep(0.002)

    def _check(self, version_dir: Path) -> str:
        # First look at the files, as TF Serving does before loading: a half-copied version would
        # show here even if it were completed by the time the load below runs.
        for required in ("saved_model.pb", "variables/variables.index"):
            if not (version_dir / required).is_file():
                return f"missing {required} at first sight"
        if not glob.glob(str(version_dir / "variables" / "variables.data-*")):
            return "no variables data file at first sight"
        try:
            model = tf.saved_model.load(str(version_dir))
            outputs = model.signatures["serving_default"](examples=tf.constant(self.examples))
            probabilities = outputs["probabilities"].numpy()
        except Exception as exc:  # noqa: BLE001 - recorded; the test reports it
            return f"failed to load or answer: {type(exc).__name__}: {str(exc)[:300]}"
        if probabilities.shape != (len(self.examples), 3):
            return f"probabilities of shape {probabilities.shape}"
        if not np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-4):
            return "probabilities do not sum to 1"
        return "ok"


@dataclass
class Campaign:
    output_dir: Path
    server: MlflowServer
    seed: int
    code: Path = REPO
    refused: dict = field(default_factory=dict)
    transform_kill: dict = field(default_factory=dict)
    trainer_kills: list[dict] = field(default_factory=list)
    stops: list[Stop] = field(default_factory=list)
    damaged: str = ""
    resumable_before_damage: int = -1  # the committed checkpoint before the damaged one
    damaged_run: PipelineProcess | None = None
    pusher_kills: list[dict] = field(default_factory=list)
    runs: list[PipelineProcess] = field(default_factory=list)  # every run that took the lock
    final: PipelineProcess | None = None
    final_exit: int | None = None
    final_summary: dict = field(default_factory=dict)
    poller: PushPoller | None = None
    push_seconds: float | None = None
    log: list[str] = field(default_factory=list)

    @property
    def pipeline_root(self) -> Path:
        return self.output_dir / "pipeline_root" / PIPELINE

    @property
    def serving_dir(self) -> Path:
        return self.output_dir / "serving" / "penguins"

    @property
    def mlmd_path(self) -> Path:
        return self.output_dir / "metadata" / f"{PIPELINE}.sqlite"

    def start(self) -> PipelineProcess:
        run = PipelineProcess(self.output_dir, self.code, self.server.uri)
        self.runs.append(run)
        return run

    def ended(self, run: PipelineProcess) -> None:
        """Records what ML Metadata says of the run's components once it ended."""
        rows = read_component_states(str(self.mlmd_path), since_ms=0) or []
        run.mlmd_states = {row.component: row.state for row in rows}

    def note(self, text: str) -> None:
        self.log.append(text)
        print(f"[campaign] {text}", flush=True)


def _entries(serving_dir: Path) -> list[str]:
    return sorted(os.listdir(serving_dir)) if serving_dir.exists() else []


def _versions(c: Campaign) -> list[str]:
    return [e for e in _entries(c.serving_dir) if e.isdigit()]


def _checkpoint_dir(c: Campaign) -> Path:
    (state_file,) = glob.glob(
        str(c.pipeline_root / "Trainer" / "training_state" / "*" / "checkpoints" / "checkpoint")
    )
    return Path(state_file).parent


def _newest_step_since(c: Campaign, since: float) -> int:
    """The newest committed checkpoint step of the training folders written to since `since`."""
    steps = [0]
    pattern = c.pipeline_root / "Trainer" / "training_state" / "*" / "checkpoints" / "checkpoint"
    for state_file in glob.glob(str(pattern)):
        with contextlib.suppress(FileNotFoundError):
            if os.stat(state_file).st_mtime >= since:
                steps.append(committed_checkpoint_step_in(Path(state_file)))
    return max(steps)


def _mlflow_statuses(c: Campaign) -> tuple[str, str]:
    """Statuses of the campaign's pipeline run and of its Trainer run, read from MLflow now."""
    client = MlflowClient(c.server.uri)
    parents = _parent_runs(client)
    if len(parents) != 1:
        return (f"{len(parents)} parent runs", "")
    trainers = _children(client, parents[0], "Trainer")
    return parents[0].info.status, ",".join(t.info.status for t in trainers)


def _parent_runs(client: MlflowClient):
    experiment = client.get_experiment_by_name(PIPELINE)
    if experiment is None:
        return []
    return client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` != ''"
    )


def _children(client: MlflowClient, parent, component: str):
    return client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and "
        f"tags.`fullthrottle.component` = '{component}'",
    )


# --- the phases -------------------------------------------------------------------------------
def _race(c: Campaign) -> PipelineProcess:
    """Two runs within a second on one folder: one proceeds, the other is refused at once."""
    first, second = c.start(), c.start()
    deadline = time.monotonic() + PHASE_TIMEOUT_SECONDS
    while first.proc.poll() is None and second.proc.poll() is None:
        assert time.monotonic() < deadline, first.text + second.text
        time.sleep(0.05)
    loser, winner = (first, second) if first.proc.poll() is not None else (second, first)
    loser.finish()
    c.runs.remove(loser)
    c.refused = {
        "exit": loser.proc.returncode,
        "seconds": time.monotonic() - loser.started,
        "text": loser.text,
        "winner_pid": winner.proc.pid,
        "winner_running": winner.proc.poll() is None,
    }
    c.note(f"second run refused: exit {loser.proc.returncode} after {c.refused['seconds']:.1f} s")
    return winner


def _kill_during_transform(c: Campaign, run: PipelineProcess, rng: random.Random) -> None:
    run.wait_for_line(r"\[pipeline\] Transform\s+running")
    # Transform ended within 8 s on an AMX machine and took up to 50 s under load: a kill
    # 0.5-3 s in lands inside it.
    delay = rng.uniform(0.5, 3.0)
    time.sleep(delay)
    run.kill()
    c.ended(run)
    c.transform_kill = {
        "delay": delay,
        "mlmd_state": run.mlmd_states.get("Transform"),
        "returncode": run.proc.returncode,
    }
    c.note(f"killed {delay:.1f} s into Transform; its MLMD state: {c.transform_kill['mlmd_state']}")


def _kill_during_trainer(c: Campaign, rng: random.Random) -> None:
    resumed_from = 0
    for index in range(TRAINER_KILLS):
        run = c.start()
        low = resumed_from + 10
        target = rng.randint(low, resumed_from + 60)
        # The first checkpoint at or after the target step: kill once it is on disk, a moment
        # later, so the kill falls between two checkpoints (the steps after it are lost).
        run.wait_until(
            lambda target=target: committed_checkpoint_step(c.pipeline_root) >= target,
            what=f"a checkpoint at step >= {target}",
        )
        seen = committed_checkpoint_step(c.pipeline_root)
        time.sleep(rng.uniform(0.0, 0.03))
        run.kill()
        c.ended(run)
        on_disk = committed_checkpoint_step(c.pipeline_root)
        starts = run.start_steps()
        kill = {
            "index": index,
            "target_step": target,
            "checkpoint_seen": seen,
            "checkpoint_on_disk": on_disk,
            "this_run_started_at": starts[-1] if starts else None,
            "returncode": run.proc.returncode,
            "run": run,
        }
        c.trainer_kills.append(kill)
        c.note(
            f"trainer kill {index + 1}: target step {target}, killed after checkpoint {seen} "
            f"(newest on disk after the kill: {on_disk}); this run had started at step "
            f"{kill['this_run_started_at']}"
        )
        resumed_from = on_disk


def _stop_in_training(c: Campaign, signum: int, rng: random.Random) -> None:
    run = c.start()
    start = int(run.wait_for_line(_RESUMED.pattern).group(1))
    run.wait_for_line(r"\[trainer\] step \d+")  # the first loop ran (traced and compiled)
    time.sleep(rng.uniform(0.2, 1.0))
    sent_at, sent = time.time(), time.monotonic()
    os.killpg(run.proc.pid, signum)  # pgid == pid: started in its own session
    run.finish()
    c.ended(run)
    exited = time.monotonic() - sent
    stopped = next(
        (t - sent for t, line in zip(run.times, run.lines, strict=False)
         if t >= sent and "[trainer] stopped" in line),
        -1.0,
    )  # fmt: skip
    match = _STOPPED.search(run.text)
    step = int(match.group(2)) if match else -1
    committed = committed_checkpoint_step(c.pipeline_root)
    index_file = _checkpoint_dir(c) / f"ckpt-{committed}.index"
    stop = Stop(
        signum=signum,
        sent_at=sent_at,
        exit_status=run.proc.returncode,
        seconds_to_exit=exited,
        seconds_to_stop=stopped,
        step=step,
        committed=committed,
        checkpoint_written_at=index_file.stat().st_mtime if index_file.exists() else -1.0,
        summary=last_run(c.output_dir) if (c.output_dir / "last_run.json").exists() else {},
        text=run.text,
        resumed_from=start,
        mlflow=_mlflow_statuses(c),
    )
    c.stops.append(stop)
    c.note(
        f"{signal.Signals(signum).name}: started at step {start}, stopped at {step}, newest "
        f"checkpoint {committed}; training stopped {stopped:.2f} s and the process exited "
        f"({stop.exit_status}) {exited:.1f} s after the signal"
    )


def _damage_newest_checkpoint(c: Campaign) -> None:
    """Cuts the newest checkpoint's data in half; notes the committed one before it."""
    state = tf.train.get_checkpoint_state(str(_checkpoint_dir(c)))
    paths = list(state.all_model_checkpoint_paths)
    assert len(paths) >= 2 and paths[-1] == state.model_checkpoint_path, paths
    newest = state.model_checkpoint_path
    c.resumable_before_damage = int(re.search(r"ckpt-(\d+)$", paths[-2]).group(1))
    data = glob.glob(newest + ".data-*")
    biggest = max(data, key=os.path.getsize)
    os.truncate(biggest, os.path.getsize(biggest) // 2)
    c.damaged = newest
    c.note(f"damaged {os.path.basename(newest)}; the one before it: {paths[-2]}")


def _classify_push_kill(
    c: Campaign, run: PipelineProcess, *, versions_before: list[str], entries_before: list[str]
) -> str:
    entries = _entries(c.serving_dir)
    versions = [e for e in entries if e.isdigit()]
    if run.mlmd_states.get("Pusher") == "complete":
        return "after the Pusher completed"
    if len(versions) > len(versions_before):
        return "after publishing, before TFX recorded the push"
    # A staging folder of this run (an earlier kill's is only removed when the push starts).
    if any(e.startswith(".staging-") and e not in entries_before for e in entries):
        return "mid-push (staging folder being written)"
    return "Pusher started, before staging"


def _calibrate_push(c: Campaign, run: PipelineProcess, scratch: Path) -> None:
    """Times one push of the Trainer's model with the pipeline's settings, the run paused."""
    from fullthrottle.core.config import ServingConfig
    from serving.push import push_model

    run.wait_for_line(r"\[pipeline\] Trainer\s+complete")
    models = glob.glob(
        str(c.pipeline_root / "Trainer" / "model" / "*" / "Format-Serving" / "saved_model.pb")
    )
    assert models, "the Trainer completed without a model"
    # The run is paused meanwhile: on a loaded machine the timing took longer than the rest of
    # the run, which then pushed and ended before any kill could land in its Pusher.
    os.killpg(run.proc.pid, signal.SIGSTOP)
    try:
        examples = eval_split_examples({"pipeline_root": str(c.pipeline_root)}, limit=256)
        started = time.monotonic()
        push_model(
            model_dir=os.path.dirname(max(models, key=os.path.getmtime)),
            serving_dir=str(scratch / "calibration"),
            model_name="penguins",
            warmup_examples=[strip_label(e, "species") for e in examples],
            warmup_count=ServingConfig().warmup_requests,
        )
        c.push_seconds = time.monotonic() - started
    finally:
        os.killpg(run.proc.pid, signal.SIGCONT)
    c.note(f"one push of this model took {c.push_seconds:.2f} s in the test process")


_PUSHER_COMPLETE = re.compile(r"\[pipeline\] Pusher\s+complete")


def _kill_during_pusher(c: Campaign, rng: random.Random, scratch: Path) -> None:
    """Random kills inside the Pusher's execution, then one right after a version appears.

    The first of these runs is the one that resumes past the damaged checkpoint. The targeted
    kill runs only while no version has been published yet: once one is, a rerun records that
    version instead of publishing again, so no new folder would appear. After a kill that landed
    once the Pusher had completed, the Pusher is cached and no push is left to interrupt.
    """
    outputs = c.pipeline_root / "Pusher" / "pushed_model"
    for index in range(PUSHER_RANDOM_KILLS + 1):
        targeted = index == PUSHER_RANDOM_KILLS
        if c.pusher_kills and c.pusher_kills[-1]["landed"] == "after the Pusher completed":
            c.note("the last kill landed after the Pusher completed: no push left to interrupt")
            return
        if targeted and _versions(c):
            c.note("a version was already published by an interrupted push: no targeted kill")
            return
        known = set(os.listdir(outputs)) if outputs.exists() else set()
        versions_before = _versions(c)
        entries_before = _entries(c.serving_dir)
        run = c.start()
        if c.damaged_run is None:
            c.damaged_run = run
        if targeted:
            # Right after a new version folder appears: published, not yet recorded by TFX.
            run.wait_until(
                lambda before=versions_before: len(_versions(c)) > len(before),
                what="a new version folder",
                poll=0.001,
            )
            delay = None
        else:
            if c.push_seconds is None:
                _calibrate_push(c, run, scratch)
            if c.poller is None:
                examples = eval_split_examples({"pipeline_root": str(c.pipeline_root)}, limit=8)
                c.poller = PushPoller(c.serving_dir, [strip_label(e, "species") for e in examples])
                c.poller.start()
            run.wait_until(
                lambda known=known: outputs.exists() and bool(set(os.listdir(outputs)) - known),
                what="the Pusher's execution",
            )
            started_at = max(
                os.stat(outputs / n).st_ctime for n in set(os.listdir(outputs)) - known
            )
            # Measured from the creation of the Pusher's output folder (wall clock, as ctime is).
            # A moment past the publish becomes "right after the publish" (1 ms polls): a kill
            # after TFX recorded the push would leave nothing to interrupt in later runs. One
            # past the Pusher's end (a rerun that records an existing version publishes nothing)
            # becomes "right after the Pusher completed", while the run still tracks: later, the
            # run would have finished the campaign's parent run, and the next would start another.
            delay = rng.uniform(0.0, PUSHER_WINDOW_MARGIN * c.push_seconds)
            while (
                time.time() < started_at + delay
                and len(_versions(c)) == len(versions_before)
                and not any(_PUSHER_COMPLETE.search(line) for line in list(run.lines))
            ):
                time.sleep(0.001)
        run.kill()
        c.ended(run)
        landed = _classify_push_kill(
            c, run, versions_before=versions_before, entries_before=entries_before
        )
        c.pusher_kills.append(
            {
                "index": index,
                "targeted": targeted,
                "delay": delay,
                "landed": landed,
                "entries_after_kill": _entries(c.serving_dir),
                "returncode": run.proc.returncode,
            }
        )
        when = "right after a version folder appeared" if targeted else f"{delay:.2f} s in"
        c.note(f"pusher kill {index + 1}: {when}: landed {landed}; {_entries(c.serving_dir)}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    started = MlflowServer(tmp_path_factory.mktemp("mlflow_server"))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def campaign(tmp_path_factory, server) -> Campaign:
    seed = int(os.environ.get("FULLTHROTTLE_FAULT_SEED", random.SystemRandom().randrange(10**6)))
    rng = random.Random(seed)
    c = Campaign(output_dir=tmp_path_factory.mktemp("campaign"), server=server, seed=seed)
    c.note(f"seed {seed} (set FULLTHROTTLE_FAULT_SEED to replay the same moments)")
    # Transform's and the Trainer's cache keys include a hash of the code: a copy, so an edit to
    # the working tree mid-campaign cannot turn a rerun into a fresh start.
    c.code = snapshot_code(tmp_path_factory.mktemp("campaign-code"))
    try:
        winner = _race(c)
        _kill_during_transform(c, winner, rng)
        _kill_during_trainer(c, rng)
        _stop_in_training(c, signal.SIGINT, rng)
        _stop_in_training(c, signal.SIGTERM, rng)
        _damage_newest_checkpoint(c)
        _kill_during_pusher(c, rng, tmp_path_factory.mktemp("campaign-scratch"))
        c.final = c.start()
        c.final_exit = c.final.finish()
        c.ended(c.final)
        c.final_summary = last_run(c.output_dir)
        time.sleep(0.5)  # let the poller see the final version
    finally:
        if c.poller is not None:
            c.poller.stop()
        for run in c.runs:
            if run.proc.poll() is None:
                run.kill()
    c.note(f"final rerun exit {c.final_exit}; push folder {_entries(c.serving_dir)}")
    c.note(f"poller: {c.poller.polls if c.poller else 0} polls, seen {c.poller and c.poller.seen}")
    return c


# --- one folder, one run at a time ------------------------------------------------------------
def test_two_runs_on_one_folder_exactly_one_proceeds(campaign):
    refused = campaign.refused
    assert refused["winner_running"], "the run that took the lock ended with the refused one"
    assert refused["exit"] == 2, refused["text"][-3000:]
    assert "another run is using the output folder" in refused["text"]
    assert f"pid {refused['winner_pid']}" in refused["text"]
    assert str(campaign.output_dir.resolve()) in refused["text"].replace("\n", "")
    assert "Traceback" not in refused["text"]


# --- SIGKILL: Transform, the Trainer ------------------------------------------------------------
def test_kill_during_transform_landed_inside_it(campaign):
    kill = campaign.transform_kill
    assert kill["returncode"] == -signal.SIGKILL
    # The store still says Transform is running: it was killed inside its execution.
    assert kill["mlmd_state"] == "running", kill


def test_trainer_resumes_from_its_checkpoint_after_each_kill(campaign):
    kills = campaign.trainer_kills
    assert len(kills) == TRAINER_KILLS
    # The first trainer run trained from scratch (the Transform kill came before any training).
    assert kills[0]["this_run_started_at"] == 0
    for before, after in zip(kills, kills[1:], strict=False):
        # Each rerun resumed exactly from the newest checkpoint the killed run left on disk.
        assert after["this_run_started_at"] == before["checkpoint_on_disk"] > 0, (before, after)
        assert after["checkpoint_on_disk"] > before["checkpoint_on_disk"], (before, after)
    for kill in kills:
        assert kill["returncode"] == -signal.SIGKILL
        assert kill["checkpoint_on_disk"] >= kill["checkpoint_seen"] >= kill["target_step"]
        assert kill["checkpoint_on_disk"] < TRAIN_STEPS, "the kill must land before the last step"
        # Killed Trainer executions are never taken from the cache: each rerun trained again.
        assert kill["run"].mlmd_states.get("Trainer") == "running", kill["run"].mlmd_states
    # The run after the last kill (SIGINT's) resumed from it.
    assert campaign.stops[0].resumed_from == kills[-1]["checkpoint_on_disk"]


def test_components_finished_before_a_kill_come_from_the_cache(campaign):
    upstream = ("ArrowExampleGen", "ImportSchema", "StatisticsGen", "ExampleValidator", "DataGate")
    reruns = campaign.runs[1:]
    for run in reruns:
        for name in upstream:
            assert run.mlmd_states.get(name) == "cached", (name, run.mlmd_states)
    # The kill inside Transform did not poison its cache: the next run executed it again.
    assert reruns[0].mlmd_states.get("Transform") == "complete", "Transform not re-run"
    for run in reruns[1:]:
        assert run.mlmd_states.get("Transform") == "cached", run.mlmd_states
    components = campaign.final_summary["components"]
    for name in (*upstream, "Transform", "Trainer"):
        assert components[name]["state"] == "cached", (name, components)
    # The Evaluator compares the model with the latest blessed one. The first run that reached it
    # (the first Pusher kill's) blessed the model, which from then on is its own baseline: a new
    # input, so the next run evaluates once more and the runs after it take that from the cache.
    evaluation = campaign.final_summary["evaluation"]
    assert evaluation["baseline"]["model_uri"] == evaluation["candidate"]["model_uri"]
    evaluated_before = len(campaign.pusher_kills)  # each of those runs got past the Evaluator
    expected = "complete" if evaluated_before == 1 else "cached"
    assert components["Evaluator"]["state"] == expected, (evaluated_before, components)
    # Cached only when a kill landed after the Pusher had completed (then nothing re-ran).
    assert components["Pusher"]["state"] in ("complete", "cached")


# --- SIGINT, SIGTERM: stop at a step, say how to resume, resume there ---------------------------
def test_each_signal_in_training_saves_its_step_and_says_how_to_resume(campaign):
    assert [s.signum for s in campaign.stops] == [signal.SIGINT, signal.SIGTERM]
    for stop in campaign.stops:
        name = signal.Signals(stop.signum).name
        status = 128 + stop.signum
        assert stop.exit_status == status, stop.text[-5000:]
        assert 0 <= stop.seconds_to_stop < 5
        assert stop.seconds_to_exit < 15
        assert f"interrupted by {name} during Trainer at step {stop.step}" in stop.text
        assert stop.resumed_from < stop.step < TRAIN_STEPS
        # The newest committed checkpoint is at the signal's step: the signal's own, written
        # after it arrived, unless a periodic save had just covered that step (file times are
        # a clock tick coarser than time.time()).
        assert stop.committed == stop.step
        if stop.step % CHECKPOINT_EVERY:
            assert stop.checkpoint_written_at >= stop.sent_at - 0.05
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
    sigint, sigterm = campaign.stops
    assert sigterm.resumed_from == sigint.step


def test_a_damaged_newest_checkpoint_is_skipped_and_the_run_finishes(campaign):
    sigterm = campaign.stops[-1]
    assert campaign.damaged.endswith(f"ckpt-{sigterm.step}")
    run = campaign.damaged_run
    # The committed checkpoint before the damaged one.
    assert run.start_steps() == [campaign.resumable_before_damage]
    assert campaign.resumable_before_damage < sigterm.step
    assert f"checkpoint {campaign.damaged} is unreadable" in run.text
    assert "[pipeline] Trainer" in run.text and "Traceback" not in run.text
    assert campaign.final_summary["status"] == "succeeded"
    assert campaign.final_summary["training"]["steps_completed"] == TRAIN_STEPS


# --- SIGKILL in the Pusher: only whole versions, pushed once ------------------------------------
def test_every_rerun_after_a_kill_completes(campaign):
    assert campaign.final_exit == 0, campaign.final.tail()
    summary = campaign.final_summary
    assert summary["status"] == "succeeded" and summary["blessed"] is True


def test_final_model_is_pushed_exactly_once_without_leftovers(campaign):
    entries = _entries(campaign.serving_dir)
    versions = [e for e in entries if e.isdigit()]
    assert len(versions) == 1, entries
    assert entries == versions, f"leftover staging or deleting folders: {entries}"
    summary = campaign.final_summary
    assert summary["pushed_version"] == versions[0]
    assert Path(summary["pushed_model_dir"]) == campaign.serving_dir / versions[0]


def test_pusher_kills_landed_inside_the_push(campaign):
    kills = campaign.pusher_kills
    assert kills and all(k["returncode"] == -signal.SIGKILL for k in kills)
    # The first kill comes no later than 1 ms after the publish, before TFX's record of it.
    assert kills[0]["landed"] != "after the Pusher completed", kills[0]
    landed = [k["landed"] for k in kills]
    # A mid-push kill leaves a staging folder, which the next push removes (see the final check).
    assert any(k.startswith("mid-push") for k in landed) or any(
        k.startswith("after publishing") for k in landed
    ), landed


def test_poller_never_saw_a_half_written_version(campaign):
    poller = campaign.poller
    assert poller is not None and poller.polls > 0
    assert poller.seen, "the poller saw no version at all"
    assert all(status == "ok" for status in poller.seen.values()), poller.seen
    assert campaign.final_summary["pushed_version"] in poller.seen
    # Every kill left the push folder holding only whole versions (or nothing) for a server.
    for kill in campaign.pusher_kills:
        for name in kill["entries_after_kill"]:
            if name.isdigit():
                assert poller.seen.get(name) == "ok", (name, poller.seen)


def test_pusher_does_not_publish_the_newest_version_again(campaign, tmp_path):
    from tfx.types import standard_artifacts

    from components.safe_pusher import Executor

    summary = campaign.final_summary
    serving_dir = tmp_path / "serving"
    shutil.copytree(campaign.serving_dir, serving_dir)
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "model")
    shutil.copytree(summary["pushed_model_dir"], tmp_path / "model" / "Format-Serving")
    examples = standard_artifacts.Examples()
    examples.uri = glob.glob(str(campaign.pipeline_root / "ArrowExampleGen" / "examples" / "*"))[0]
    examples.split_names = '["train", "eval"]'

    def push(warmup_requests: int) -> standard_artifacts.PushedModel:
        pushed = standard_artifacts.PushedModel()
        pushed.uri = str(tmp_path / f"pushed-{warmup_requests}")
        push_config = {"keep_versions": 0, "tflite": False, "tflite_quantize": False}
        Executor().Do(
            {"model": [model], "examples": [examples]},
            {"pushed_model": [pushed]},
            {
                "serving_dir": str(serving_dir),
                "model_name": "penguins",
                "label": "species",
                "push_config": json.dumps({**push_config, "warmup_requests": warmup_requests}),
            },
        )
        return pushed

    # The same model with the same push settings (what a rerun after a kill between the publish
    # and TFX's record executes): recorded as the existing version, nothing new published.
    default_warmup = summary["config"]["serving"]["warmup_requests"]
    again = push(default_warmup)
    assert again.get_string_custom_property("pushed_version") == summary["pushed_version"]
    assert sorted(version_dirs(serving_dir)) == [int(summary["pushed_version"])]
    # A changed push setting is a real push: a new version with the new warmup file.
    changed = push(8)
    assert sorted(version_dirs(serving_dir)) == sorted(
        [int(summary["pushed_version"]), int(changed.get_string_custom_property("pushed_version"))]
    )


# --- MLflow across the campaign: one parent run, one Trainer run, every step once ---------------
def test_mlflow_keeps_one_parent_run_through_every_interruption(campaign):
    client = MlflowClient(campaign.server.uri)
    parents = _parent_runs(client)
    assert len(parents) == 1, [p.info.run_id for p in parents]
    parent = parents[0]
    ids = [s.summary["tracking"]["run_id"] for s in campaign.stops]
    assert ids == [parent.info.run_id] * 2
    assert campaign.final_summary["tracking"]["run_id"] == parent.info.run_id
    assert all(s.summary["tracking"]["reattached"] for s in campaign.stops)
    assert campaign.final_summary["tracking"]["reattached"] is True
    assert parent.info.status == "FINISHED"
    # Every run that took the lock attached to it once (SIGKILLed ones included).
    assert parent.data.tags["fullthrottle.attempts"] == str(len(campaign.runs))
    assert parent.data.tags["fullthrottle.interrupted_by"] == "SIGTERM"  # the last signal
    (trainer,) = _children(client, parent, "Trainer")
    assert trainer.info.status == "FINISHED"
    assert trainer.data.tags["fullthrottle.unreadable_checkpoints"] == campaign.damaged
    # Across two SIGKILLs, two signals and a resume from behind the newest checkpoint, each
    # curve holds every loop's step exactly once.
    expected = list(range(STEPS_PER_LOOP, TRAIN_STEPS + 1, STEPS_PER_LOOP))
    for key in _CURVES:
        steps = sorted(m.step for m in client.get_metric_history(trainer.info.run_id, key))
        assert steps == expected, (
            f"{key}: duplicated or missing steps {sorted(set(expected) ^ set(steps))[:10]}"
        )


def test_pipeline_run_is_tracked_with_params_metrics_artifacts_and_registered_model(
    campaign, tmp_path
):
    client = MlflowClient(campaign.server.uri)
    (parent,) = _parent_runs(client)
    last = campaign.final_summary
    assert last["tracking"]["complete"] is True, last["tracking"]
    assert last["tracking"]["run_id"] == parent.info.run_id
    tags, params, metrics = parent.data.tags, parent.data.params, parent.data.metrics
    # Tags: MLflow's source tags and git state, pipeline, TFX run id, MLMD execution ids,
    # versions, device, strategy.
    assert tags["mlflow.user"] and tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.source.name"]
    assert tags["fullthrottle.pipeline_name"] == PIPELINE
    assert tags["fullthrottle.tfx_run_id"] == last["run_id"]
    assert tags["fullthrottle.execution_id.Trainer"] == str(
        last["components"]["Trainer"]["execution_id"]
    )
    assert tags["fullthrottle.version.tensorflow"].startswith("2.")
    assert tags["fullthrottle.device"] and tags["fullthrottle.strategy"]
    # Params: the resolved config that applies to a local run, flattened, plus derived values;
    # no Kubeflow section, no unset field written as 'None'.
    assert params["training.train_steps"] == str(TRAIN_STEPS)
    assert params["pipeline_name"] == PIPELINE
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
    assert not re.findall(r"WARNING mlflow\S*:.*", campaign.final.text), campaign.final.tail()
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


def test_logged_model_answers_like_the_pushed_model(campaign, monkeypatch, tmp_path):
    import mlflow.pyfunc
    import pandas as pd

    # mlflow-artifacts: URIs resolve through the tracking server.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", campaign.server.uri)
    downloaded = tmp_path / "downloaded"  # not a temp folder MLflow would leave behind
    downloaded.mkdir()
    # The registered model, as a user would name it: its alias.
    model = mlflow.pyfunc.load_model("models:/penguins@champion", dst_path=str(downloaded))
    assert model.metadata.model_id == campaign.final_summary["tracking"]["model_id"]
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
    pushed = tf.saved_model.load(campaign.final_summary["pushed_model_dir"])
    raw = pushed.signatures["predict_raw"]
    specs = raw.structured_input_signature[1]
    direct = raw(
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


# --- after the campaign, on its folder and server: `compare`, and a server that dies ------------
def _run_to_end(c: Campaign, *extra: str, tracking_uri: str | None = None) -> PipelineProcess:
    run = PipelineProcess(c.output_dir, c.code, tracking_uri or c.server.uri, *extra)
    run.finish()
    return run


def test_compare_shows_differing_params_and_writes_chart(campaign, tmp_path):
    steps_b = 1500
    # Tracking is under test here, not the blessing: judged on the bar alone, so a model a hair
    # less accurate than the campaign's is still pushed (`evaluation.baseline: none`).
    run = _run_to_end(
        campaign, "--set", f"training.train_steps={steps_b}", "--set",
        "training.learning_rate=0.003", "--set", "tracking.points_per_curve=100",
        "--set", "evaluation.baseline=none",
    )  # fmt: skip
    assert run.proc.returncode == 0, run.tail()
    # About 100 points per curve: 150 loops of 10 steps, a point in each 15-step span.
    client = MlflowClient(campaign.server.uri)
    newest = sorted(_parent_runs(client), key=lambda r: r.info.start_time)[-1]
    (trainer,) = _children(client, newest, "Trainer")
    loss = client.get_metric_history(trainer.info.run_id, "train/loss")
    assert len(loss) == 100, len(loss)
    assert max(m.step for m in loss) == steps_b
    chart = tmp_path / "compare.png"
    result = subprocess.run(
        [sys.executable, "-m", "fullthrottle", "compare", "--last", "2",
         "--output-dir", str(campaign.output_dir), "--chart", str(chart)],
        cwd=campaign.code, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(campaign.code),
             "MLFLOW_TRACKING_URI": campaign.server.uri},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = {
        line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line.strip()
    }
    assert lines["training.learning_rate"] == ["0.001", "0.003"]
    assert lines["training.train_steps"] == [str(TRAIN_STEPS), str(steps_b)]
    assert "training.seed" not in lines, "identical params must not be listed"
    assert len(lines["accuracy"]) == 2 and len(lines["examples/s"]) == 2
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 10_000


def test_tracking_server_down_during_training_does_not_stop_the_run(campaign, tmp_path):
    doomed = MlflowServer(tmp_path / "doomed_server")
    try:
        run = PipelineProcess(
            campaign.output_dir, campaign.code, doomed.uri,
            "--set", "training.train_steps=900", "--set", "tracking.retries=1",
            "--set", "tracking.retry_backoff_seconds=0.2",
            "--set", "tracking.request_timeout_seconds=5",
            "--set", "tracking.flush_timeout_seconds=10",
            # Judged on the bar alone, as the compare run above (the push is checked, not the rule).
            "--set", "evaluation.baseline=none",
        )  # fmt: skip
        # Its own checkpoint folder (another training config): a checkpoint of step >= 200.
        run.wait_until(
            lambda: _newest_step_since(campaign, run.started_wall) >= 200,
            what="a checkpoint at step >= 200",
            poll=0.05,
        )
    finally:
        doomed.stop()
    assert run.finish() == 0, run.tail()
    last = last_run(campaign.output_dir)
    assert last["training"]["steps_completed"] == 900
    assert last["pushed_model_dir"] and Path(last["pushed_model_dir"], "saved_model.pb").exists()
    assert last["tracking"]["complete"] is False
    assert last["tracking"]["failures"]
    assert "MLflow tracking is INCOMPLETE" in run.text
