"""Fault injection: SIGKILL the real `fullthrottle run` during Transform, the Trainer and the Pusher.

One campaign (a module fixture) drives a single output folder through the crashes a preempted
machine produces, on the bundled penguins data, real components on real Beam:

1. kill during Transform (a random moment after ``[pipeline] Transform running``);
2. kill during the Trainer at a random step, rerun, kill again at a later step, three times
   (the step is the newest committed checkpoint: the one CheckpointManager's state file names);
3. kill at a random moment of the Pusher's execution (from the creation of its output folder,
   which TFX makes when the execution starts), three times;
4. kill right after a new version folder appears (after the publish, before TFX records it);
5. a last rerun that must finish and push.

Every process is started in its own session and killed with `os.killpg(pgid, SIGKILL)`. A
poller thread watches the push folder from step 3 on and loads every version folder it sees.
The tests below assert on what the campaign recorded; where each kill landed is printed (run
pytest with ``-s``) and summarized in docs/reliability.md.
"""

from __future__ import annotations

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

from fullthrottle.progress import read_component_states
from serving.push import version_dirs
from tests.helpers import (
    REPO,
    CliProcess,
    committed_checkpoint_step,
    eval_split_examples,
    last_run,
    snapshot_code,
    strip_label,
)

pytestmark = pytest.mark.slow

# Kill targets are drawn within 60 steps of where a run resumed (at most ~200 over the three
# kills), and a kill lands up to ~35 ms (a 5 ms poll and a 0-30 ms wait) after its checkpoint.
# The tabular model trains fast (a kill aimed at step 21 first saw checkpoint 40: 20 steps and a
# save fell between two polls), so with 200 steps in all a kill could land after the last step
# (it did once in CI). 2,000 leave ~1,800 steps and 90 saves after any kill target.
TRAIN_STEPS = 2000
CHECKPOINT_EVERY = 20
TRAINER_KILLS = 3
PUSHER_RANDOM_KILLS = 4
RUN_ARGS = (
    "--set",
    f"training.train_steps={TRAIN_STEPS}",
    "--set",
    f"training.checkpoint_every_steps={CHECKPOINT_EVERY}",
    "--set",
    "training.steps_per_loop=10",
)
# The Pusher's execution took 1.5 s and 4.8 s in two runs here (the push's own checks changed in
# between): its length is measured in the campaign by one push of the same model with the same
# settings (`_calibrate_push`), and random kills are drawn over 1.1x that from the Pusher's start.
PUSHER_WINDOW_MARGIN = 1.1
PHASE_TIMEOUT_SECONDS = 420
_RESUMED = re.compile(r"\[trainer\] start step (\d+)/(\d+)")


class PipelineProcess(CliProcess):
    """One `fullthrottle run` of the campaign on ``output_dir``."""

    def __init__(self, output_dir: Path, code: Path) -> None:
        # A SIGKILLed run cannot remove its scratch folder: keep it in the test's tmp.
        temp = output_dir.with_name(f"{output_dir.name}-tmp")
        temp.mkdir(parents=True, exist_ok=True)
        super().__init__(
            "run",
            "--output-dir",
            str(output_dir),
            *RUN_ARGS,
            code=code,
            env={"TMPDIR": str(temp)},
        )
        self.mlmd_states: dict[str, str] = {}  # after a kill: this run's components in MLMD

    def wait_for(self, condition, *, what: str, poll: float = 0.005) -> None:
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

    def finish(self, timeout: float = PHASE_TIMEOUT_SECONDS) -> int:
        return super().finish(timeout)

    def component_states(self) -> dict[str, str]:
        """States of this run's components in ML Metadata (`[pipeline]` lines, exit or kill aside)."""
        states = {}
        for line in self.lines:
            match = re.match(
                r"\[pipeline\] (\w+)\s+(running|complete|cached|failed|canceled)\b", line
            )
            if match:
                states[match.group(1)] = match.group(2)
        return states


def _mlmd_states(mlmd_path: Path) -> dict[str, str]:
    """Component -> state of the newest pipeline run, read from (a copy of) the MLMD store."""
    rows = read_component_states(str(mlmd_path), since_ms=0) or []
    return {row.component: row.state for row in rows}


def _serving_entries(serving_dir: Path) -> list[str]:
    return sorted(os.listdir(serving_dir)) if serving_dir.exists() else []


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
            for name in _serving_entries(self.serving_dir):
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
            batch = tf.constant(self.examples)
            outputs = model.signatures["serving_default"](examples=batch)
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
    pipeline_root: Path
    serving_dir: Path
    seed: int
    transform_kill: dict = field(default_factory=dict)
    trainer_kills: list[dict] = field(default_factory=list)
    pusher_kills: list[dict] = field(default_factory=list)
    reruns: list[PipelineProcess] = field(default_factory=list)
    final: PipelineProcess | None = None
    final_exit: int | None = None
    poller: PushPoller | None = None
    log: list[str] = field(default_factory=list)
    push_seconds: float | None = None
    code: Path = REPO

    def note(self, text: str) -> None:
        self.log.append(text)
        print(f"[faults] {text}", flush=True)


def _kill_during_transform(c: Campaign, rng: random.Random) -> None:
    run = PipelineProcess(c.output_dir, c.code)
    run.wait_for(lambda: "Transform" in run.component_states(), what="Transform started", poll=0.05)
    delay = rng.uniform(2.0, 8.0)  # Transform took 28-50 s here: the kill lands well inside it
    time.sleep(delay)
    run.kill()
    state = _mlmd_states(c.output_dir / "metadata" / "fullthrottle-penguins.sqlite").get(
        "Transform"
    )
    c.transform_kill = {"delay": delay, "mlmd_state": state, "returncode": run.proc.returncode}
    c.note(f"killed {delay:.1f} s into Transform; its MLMD state: {state}")


def _kill_during_trainer(c: Campaign, rng: random.Random) -> None:
    resumed_from = 0
    for index in range(TRAINER_KILLS):
        run = PipelineProcess(c.output_dir, c.code)
        c.reruns.append(run)
        low = resumed_from + 10
        high = min(resumed_from + 60, TRAIN_STEPS - 2 * CHECKPOINT_EVERY)
        target = rng.randint(low, max(low, high))
        # The first checkpoint at or after the target step: kill once it is on disk, a moment
        # later, so the kill falls between two checkpoints (the steps after it are lost).
        run.wait_for(
            lambda target=target: committed_checkpoint_step(c.pipeline_root) >= target,
            what=f"a checkpoint at step >= {target}",
        )
        seen = committed_checkpoint_step(c.pipeline_root)
        time.sleep(rng.uniform(0.0, 0.03))
        run.kill()
        run.mlmd_states = _mlmd_states(c.output_dir / "metadata" / "fullthrottle-penguins.sqlite")
        on_disk = committed_checkpoint_step(c.pipeline_root)
        start = [int(m.group(1)) for line in run.lines if (m := _RESUMED.search(line))]
        kill = {
            "index": index,
            "target_step": target,
            "checkpoint_seen": seen,
            "checkpoint_on_disk": on_disk,
            "this_run_started_at": start[-1] if start else None,
            "states_before_kill": run.component_states(),
            "returncode": run.proc.returncode,
        }
        c.trainer_kills.append(kill)
        c.note(
            f"trainer kill {index + 1}: target step {target}, killed after checkpoint {seen} "
            f"(newest on disk after the kill: {on_disk}); this run had started at step "
            f"{kill['this_run_started_at']}"
        )
        resumed_from = on_disk


def _classify_push_kill(
    c: Campaign, *, versions_before: list[str], entries_before: list[str]
) -> str:
    entries = _serving_entries(c.serving_dir)
    versions = [e for e in entries if e.isdigit()]
    state = _mlmd_states(c.output_dir / "metadata" / "fullthrottle-penguins.sqlite").get("Pusher")
    if state == "complete":
        return "after the Pusher completed"
    if len(versions) > len(versions_before):
        return "after publishing, before TFX recorded the push"
    # A staging folder of this run (an earlier kill's is only removed when the push starts).
    if any(e.startswith(".staging-") and e not in entries_before for e in entries):
        return "mid-push (staging folder being written)"
    return "Pusher started, before staging"


def _pusher_started(c: Campaign, known: set[str]):
    def started() -> bool:
        outputs = c.pipeline_root / "Pusher" / "pushed_model"
        return outputs.exists() and bool(set(os.listdir(outputs)) - known)

    return started


def _versions(c: Campaign) -> list[str]:
    return [e for e in _serving_entries(c.serving_dir) if e.isdigit()]


def _calibrate_push(c: Campaign, run: PipelineProcess, scratch: Path) -> None:
    """Times one push of the Trainer's model, with the pipeline's settings, while Evaluator runs."""
    from fullthrottle.core.config import ServingConfig
    from serving.push import push_model

    run.wait_for(
        lambda: run.component_states().get("Trainer") == "complete", what="the Trainer", poll=0.05
    )
    models = glob.glob(
        str(c.pipeline_root / "Trainer" / "model" / "*" / "Format-Serving" / "saved_model.pb")
    )
    assert models, "the Trainer completed without a model"
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
    c.note(f"one push of this model took {c.push_seconds:.2f} s in the test process")


def _kill_during_pusher(c: Campaign, rng: random.Random, scratch: Path) -> None:
    """Random kills inside the Pusher's execution, then one right after a version appears.

    The targeted kill runs only while no version has been published yet: once one is (by it or
    by a random kill that landed after the publish), a rerun records that version instead of
    publishing again, so no new folder would appear. After a kill that landed once the Pusher
    had completed, the Pusher is cached and no further push can be interrupted.
    """
    for index in range(PUSHER_RANDOM_KILLS + 1):
        targeted = index == PUSHER_RANDOM_KILLS
        if c.pusher_kills and c.pusher_kills[-1]["landed"] == "after the Pusher completed":
            c.note("the last kill landed after the Pusher completed: no push left to interrupt")
            return
        if targeted and _versions(c):
            c.note("a version was already published by an interrupted push: no targeted kill")
            return
        outputs = c.pipeline_root / "Pusher" / "pushed_model"
        known = set(os.listdir(outputs)) if outputs.exists() else set()
        versions_before = _versions(c)
        entries_before = _serving_entries(c.serving_dir)
        run = PipelineProcess(c.output_dir, c.code)
        c.reruns.append(run)
        if targeted:
            # Right after a new version folder appears: published, not yet recorded by TFX.
            run.wait_for(
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
            run.wait_for(_pusher_started(c, known), what="the Pusher's execution")
            started_at = max(
                os.stat(outputs / n).st_ctime for n in set(os.listdir(outputs)) - known
            )
            # Measured from the creation of the Pusher's output folder (wall clock, as ctime is).
            # A moment past the publish becomes "right after the publish" (1 ms polls): a kill
            # after TFX recorded the push would leave nothing to interrupt in later runs.
            delay = rng.uniform(0.0, PUSHER_WINDOW_MARGIN * c.push_seconds)
            while time.time() < started_at + delay and len(_versions(c)) == len(versions_before):
                time.sleep(0.001)
        run.kill()
        run.mlmd_states = _mlmd_states(c.output_dir / "metadata" / "fullthrottle-penguins.sqlite")
        landed = _classify_push_kill(
            c, versions_before=versions_before, entries_before=entries_before
        )
        kill = {
            "index": index,
            "targeted": targeted,
            "delay": delay,
            "landed": landed,
            "entries_after_kill": _serving_entries(c.serving_dir),
            "returncode": run.proc.returncode,
        }
        c.pusher_kills.append(kill)
        when = (
            "right after a version folder appeared"
            if targeted
            else f"{delay:.2f} s into the Pusher"
        )
        c.note(
            f"pusher kill {index + 1}: {when}: landed {landed}; push folder {kill['entries_after_kill']}"
        )


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> Campaign:
    output_dir = tmp_path_factory.mktemp("faults")
    seed = int(os.environ.get("FULLTHROTTLE_FAULT_SEED", random.SystemRandom().randrange(10**6)))
    rng = random.Random(seed)
    c = Campaign(
        output_dir=output_dir,
        pipeline_root=output_dir / "pipeline_root" / "fullthrottle-penguins",
        serving_dir=output_dir / "serving" / "penguins",
        seed=seed,
    )
    c.note(f"seed {seed} (set FULLTHROTTLE_FAULT_SEED to replay the same kill points)")
    c.code = snapshot_code(tmp_path_factory.mktemp("faults-code"))
    try:
        _kill_during_transform(c, rng)
        _kill_during_trainer(c, rng)
        _kill_during_pusher(c, rng, tmp_path_factory.mktemp("faults-scratch"))
        c.final = PipelineProcess(output_dir, c.code)
        c.final_exit = c.final.finish()
        time.sleep(0.5)  # let the poller see the final version
    finally:
        if c.poller is not None:
            c.poller.stop()
    c.note(f"final rerun exit {c.final_exit}; push folder {_serving_entries(c.serving_dir)}")
    c.note(
        f"poller: {c.poller.polls if c.poller else 0} polls, versions seen {c.poller.seen if c.poller else {}}"
    )
    return c


def test_kill_during_transform_landed_inside_it(campaign):
    kill = campaign.transform_kill
    assert kill["returncode"] == -signal.SIGKILL
    # The store still says Transform is running: it was killed inside its execution.
    assert kill["mlmd_state"] == "running", kill


def test_every_rerun_after_a_kill_completes(campaign):
    assert campaign.final_exit == 0, campaign.final.tail()
    summary = last_run(campaign.output_dir)
    assert summary["status"] == "succeeded" and summary["blessed"] is True


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
    # The run after the last trainer kill resumed from it and trained to the end.
    after_last = campaign.reruns[TRAINER_KILLS]
    starts = [int(m.group(1)) for line in after_last.lines if (m := _RESUMED.search(line))]
    assert starts == [kills[-1]["checkpoint_on_disk"]], after_last.tail()
    training = last_run(campaign.output_dir)["training"]
    assert training["steps_completed"] == TRAIN_STEPS


def test_components_finished_before_a_kill_come_from_the_cache(campaign):
    # Read from ML Metadata right after each kill (a run whose components were all cached can
    # reach its kill before the progress thread printed a line).
    upstream = ("CsvExampleGen", "ImportSchema", "StatisticsGen", "ExampleValidator", "DataGate")
    for run in campaign.reruns:
        for name in upstream:
            assert run.mlmd_states.get(name) == "cached", (name, run.mlmd_states)
    # The kill inside Transform did not poison its cache: the next run executed it again.
    assert campaign.reruns[0].mlmd_states.get("Transform") == "complete", "Transform not re-run"
    for run in campaign.reruns[1:]:
        assert run.mlmd_states.get("Transform") == "cached", run.mlmd_states
    # Killed Trainer executions were never taken from the cache: each rerun trained again.
    for run in campaign.reruns[:TRAINER_KILLS]:
        assert run.mlmd_states.get("Trainer") == "running", run.mlmd_states
    components = last_run(campaign.output_dir)["components"]
    for name in (*upstream, "Transform", "Trainer", "Evaluator"):
        assert components[name]["state"] == "cached", (name, components)
    # Cached only when a kill landed after the Pusher had completed (then nothing re-ran).
    assert components["Pusher"]["state"] in ("complete", "cached")


def test_final_model_is_pushed_exactly_once_without_leftovers(campaign):
    entries = _serving_entries(campaign.serving_dir)
    versions = [e for e in entries if e.isdigit()]
    assert len(versions) == 1, entries
    assert entries == versions, f"leftover staging or deleting folders: {entries}"
    summary = last_run(campaign.output_dir)
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
    final_version = last_run(campaign.output_dir)["pushed_version"]
    assert final_version in poller.seen
    # Every kill left the push folder holding only whole versions (or nothing) for a server.
    for kill in campaign.pusher_kills:
        for name in kill["entries_after_kill"]:
            if name.isdigit():
                assert poller.seen.get(name) == "ok", (name, poller.seen)


# --- the recovery pieces the campaign relies on, each checked on its own ----------------------
_HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
"""


def test_staging_of_a_live_push_is_kept_and_of_a_killed_one_removed(tmp_path):
    from serving.push import remove_abandoned_folders

    serving_dir = tmp_path / "serving"
    live = serving_dir / ".staging-7-aaaaaaaa"
    (live / "variables").mkdir(parents=True)
    (serving_dir / "7").mkdir()  # a published version is never touched
    (serving_dir / ".deleting-3-bbbbbbbb").mkdir()  # retention killed mid-delete
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(live)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert remove_abandoned_folders(str(serving_dir)) == [".deleting-3-bbbbbbbb"]
        assert sorted(os.listdir(serving_dir)) == [".staging-7-aaaaaaaa", "7"]
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    # Its owner is dead (the kernel dropped the lock): the next push's clean-up removes it.
    assert remove_abandoned_folders(str(serving_dir)) == [".staging-7-aaaaaaaa"]
    assert sorted(os.listdir(serving_dir)) == ["7"]


def test_pusher_does_not_publish_the_newest_version_again(campaign, tmp_path):
    from tfx.types import standard_artifacts

    from components.safe_pusher import Executor

    summary = last_run(campaign.output_dir)
    serving_dir = tmp_path / "serving"
    shutil.copytree(campaign.serving_dir, serving_dir)
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "model")
    shutil.copytree(summary["pushed_model_dir"], tmp_path / "model" / "Format-Serving")
    examples = standard_artifacts.Examples()
    examples.uri = glob.glob(str(campaign.pipeline_root / "CsvExampleGen" / "examples" / "*"))[0]
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
