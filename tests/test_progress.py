"""Progress while work runs: pipeline components from MLMD, the Trainer's step/loss/examples/s/ETA."""

from __future__ import annotations

import io
import os
import re
import shutil
import sqlite3

import pytest

from fullthrottle.progress import TrainerProgress, read_component_states
from tests import training_data
from tests.own_data import TRAIN_STEPS, own_data_run
from trainer_module.training import TrainingConfig, train

COMPONENTS = (
    "ArrowExampleGen",
    "StatisticsGen",
    "SchemaGen",
    "ExampleValidator",
    "Transform",
    "Trainer",
    "Evaluator",
    "Pusher",
)
# Any C0 control character but newline and tab, and DEL: a terminal would act on them.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@pytest.fixture(scope="module")
def own_data(tmp_path_factory):
    return own_data_run(tmp_path_factory)


@pytest.mark.slow
def test_a_non_terminal_run_prints_plain_lines_with_components_and_throughput(own_data):
    result = own_data.run
    assert result.returncode == 0, result.stderr[-5000:]
    stderr = result.stderr
    # No line was redrawn (a terminal bar would use "\r"), and the progress lines are plain text.
    # (Other libraries' warnings are not checked: MLflow colours its warnings even in a pipe.)
    assert "\r" not in stderr
    progress = [line for line in stderr.splitlines() if re.search(r"\[(pipeline|trainer)\]", line)]
    assert progress and all(line.startswith(("[pipeline] ", "[trainer] ")) for line in progress)
    assert not any(CONTROL.search(line) for line in progress)
    pipeline_lines = [line for line in progress if line.startswith("[pipeline] ")]
    for component in COMPONENTS:
        final = [
            line
            for line in pipeline_lines
            if re.match(rf"\[pipeline\] {component}\s+(complete|cached)\s+[\d.]+ s$", line)
        ]
        assert final, (component, pipeline_lines)
    # A component is reported when it finishes, so the order of completions is the DAG's order.
    completed = [line.split()[1] for line in pipeline_lines if " complete " in line]
    assert completed.index("Transform") < completed.index("Trainer") < completed.index("Evaluator")

    trainer_lines = [line for line in progress if line.startswith("[trainer] ")]
    steps = [
        re.search(r"step (\d+)/(\d+) \(\d+%\) loss=([\d.]+) examples/s=(\d+).* eta=\S+$", line)
        for line in trainer_lines
    ]
    steps = [m for m in steps if m]
    assert steps, trainer_lines
    assert int(steps[-1].group(1)) == TRAIN_STEPS and int(steps[-1].group(2)) == TRAIN_STEPS
    assert all(int(m.group(4)) > 0 for m in steps)
    assert any(
        line.startswith("[trainer] done:") and "examples/s=" in line for line in trainer_lines
    )


@pytest.mark.slow
def test_component_states_are_read_back_from_the_run_store(own_data):
    mlmd = next((own_data.output_dir / "metadata").glob("*.sqlite"))
    states = read_component_states(str(mlmd), since_ms=0)
    assert states is not None
    found = {s.component: s.state for s in states}
    # Every component of the run completed; the pipeline may hold more than the core ones.
    assert set(COMPONENTS) <= set(found), found
    assert set(found.values()) == {"complete"}, found
    assert all(s.seconds >= 0 for s in states)
    # A run that started after the newest one recorded is not there yet.
    assert read_component_states(str(mlmd), since_ms=2**62) is None
    assert read_component_states(str(own_data.workdir / "missing.sqlite"), since_ms=0) is None


@pytest.mark.slow
def test_the_poller_reads_while_a_writer_holds_the_store_exclusively(own_data, tmp_path):
    """The poller takes no SQLite lock on the live store, so it can never make the pipeline's
    own writes wait or fail: it reads a byte copy, through ML Metadata's API."""
    live = tmp_path / "live.sqlite"
    shutil.copyfile(next((own_data.output_dir / "metadata").glob("*.sqlite")), live)
    writer = sqlite3.connect(live, timeout=0, isolation_level=None)
    try:
        writer.execute("BEGIN EXCLUSIVE")  # what a pipeline holds while it commits
        # Anything that reads through SQLite is refused now (and, the other way round, a reader
        # holding its shared lock makes such a writer fail with "database is locked").
        reader = sqlite3.connect(f"file:{live}?mode=ro", uri=True, timeout=0)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            reader.execute("SELECT count(*) FROM sqlite_master").fetchone()
        reader.close()
        states = read_component_states(str(live), since_ms=0)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert states is not None
    assert set(COMPONENTS) <= {s.component for s in states}
    assert {s.state for s in states} == {"complete"}


def _train_with(tmp_path, hook: TrainerProgress, steps: int = 60):
    inputs = training_data.tabular_inputs()
    files = training_data.write_records(tmp_path / "data", inputs, files=1, per_file=256)
    config = TrainingConfig(
        per_replica_batch_size=16,
        train_steps=steps,
        steps_per_loop=20,
        strategy="one_device",
        precision="float32",
    )
    return train(
        config=config,
        model_inputs=inputs,
        feature_spec=training_data.feature_spec(inputs),
        train_files=files,
        eval_files=files,
        work_dir=str(tmp_path / "work"),
        hooks=[hook],
    )


def test_trainer_progress_without_a_terminal_is_plain_lines(tmp_path):
    stream = io.StringIO()  # not a TTY
    # Interval 0: a line for every loop, so the count below is exact.
    _train_with(tmp_path, TrainerProgress(stream, plain_interval_seconds=0))
    text = stream.getvalue()
    assert not CONTROL.search(text)
    lines = text.splitlines()
    assert lines[0].startswith("[trainer] start step 0/60: tabular model")
    assert [re.search(r"step (\d+)/60", line).group(1) for line in lines[1:4]] == ["20", "40", "60"]
    assert all("loss=" in line and "examples/s=" in line and "eta=" in line for line in lines[1:4])
    assert lines[4].startswith("[trainer] done: 60 steps")


def test_trainer_progress_lines_are_throttled_but_keep_first_and_last(tmp_path):
    stream = io.StringIO()
    _train_with(tmp_path, TrainerProgress(stream, plain_interval_seconds=3600))
    steps = re.findall(r"\] step (\d+)/60", stream.getvalue())
    assert steps == ["20", "60"]


def test_trainer_progress_on_a_terminal_redraws_one_bar_line(tmp_path):
    master, replica = os.openpty()
    try:
        with os.fdopen(replica, "w", closefd=False) as terminal:
            assert terminal.isatty()
            _train_with(tmp_path, TrainerProgress(terminal))
        os.set_blocking(master, False)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        output = b"".join(chunks).decode()
    finally:
        os.close(master)
        os.close(replica)
    # Each update returns to the start of the line and clears it; the bar fills up.
    assert output.count("\r\x1b[K[trainer] [") == 3
    assert re.search(r"\[#{8}-{16}\] 20/60 loss \d", output)
    assert "[" + "#" * 24 + "] 60/60" in output
    # The bar's line is ended before the closing summary.
    assert re.search(r"60/60 .*ETA \S+\r?\n.*\[trainer\] done: 60 steps", output)
