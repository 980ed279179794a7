"""Helpers shared by tests: running the CLI as a user would, reading pushed models."""

from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import tensorflow as tf

REPO = Path(__file__).resolve().parent.parent

_CKPT = re.compile(r"ckpt-(\d+)\b")


def gpu_set_installed() -> bool:
    """Whether this environment holds requirements-gpu.lock's packages (the CUDA wheels, NVML):
    bin/envrun installs them only where it finds an NVIDIA driver or FULLTHROTTLE_ENV_GPU=1."""
    import importlib.metadata

    names = re.findall(r"^([A-Za-z0-9_.\-]+)==", (REPO / "requirements-gpu.lock").read_text(), re.M)
    try:
        for name in names:
            importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return bool(names)


# A CPU-only environment: the CUDA libraries are checked in the gpu image instead.
needs_gpu_set = pytest.mark.skipif(
    not gpu_set_installed(),
    reason="a CPU-only environment (requirements-gpu.lock not installed); the gpu image's CUDA "
    "libraries are checked by tests/host/check_image.sh",
)


def committed_checkpoint_step(pipeline_root: Path) -> int:
    """The newest *committed* Trainer checkpoint: the step the `checkpoint` state file names.

    `CheckpointManager` writes `ckpt-N.index`/`.data` first and the state file last, so a kill
    between the two leaves a `ckpt-N.index` that is not (and must not be) resumed from; counting
    index files would expect a resume from a checkpoint that was never committed."""
    pattern = str(pipeline_root / "Trainer" / "training_state" / "*" / "checkpoints" / "checkpoint")
    return max((committed_checkpoint_step_in(Path(f)) for f in glob.glob(pattern)), default=0)


def committed_checkpoint_step_in(state_file: Path) -> int:
    """The step that one checkpoint folder's state file names (0 when it names none)."""
    try:
        text = state_file.read_text(encoding="utf-8")
    except FileNotFoundError:  # moved aside or removed between the listing and the read
        return 0
    for line in text.splitlines():
        if line.startswith("model_checkpoint_path:") and (m := _CKPT.search(line)):
            return int(m.group(1))
    return 0


def once_per_session(tmp_path_factory, name: str, create: Callable[[Path], dict]) -> dict:
    """`create(folder)` run once per pytest session, whatever the number of xdist workers.

    Each worker has a temp root of its own below the session's; the first worker to ask takes an
    exclusive lock in the session's root and creates the value (plain data, kept as JSON beside
    its folder); the others wait on the lock and read it. Without xdist it is a plain cache.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder, value_file = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if value_file.exists():
            return json.loads(value_file.read_text())
        folder.mkdir(exist_ok=True)
        value = create(folder)
        value_file.write_text(json.dumps(value))
        return value


def snapshot_code(target: Path) -> Path:
    """A copy of the project's files as they are now, for a campaign of runs to use throughout.

    Transform's and the Trainer's cache keys (and the Trainer's checkpoint folder) include a hash
    of trainer_module/ and serving/: an edit to the shared working tree during the campaign would
    rightly be a cache miss and a fresh training, and the campaign would test nothing.
    """
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for relative in filter(None, listed.split("\0")):
        source = REPO / relative
        if source.is_file():
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / relative)
    return target


def user_environment(*, code: Path) -> dict[str, str]:
    """This process's environment without the TensorFlow log level tests/conftest.py sets (the
    CLI chooses its own), with ``code`` (the project) on the Python path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP_")}
    env["PYTHONPATH"] = str(code) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 900, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Runs `fullthrottle ARGS` in a fresh Python process (the console script's entry point),
    with the environment a user has (not this test process's TensorFlow log level)."""
    full_env = user_environment(code=REPO)
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "fullthrottle", *args],
        cwd=cwd or REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class CliProcess:
    """`fullthrottle ARGS` started in its own session (a process group, so a signal or a kill
    reaches every child), from ``code`` (a copy of the project, see :func:`snapshot_code`); a
    thread collects its output lines (stdout and stderr) and when each was read."""

    def __init__(self, *args: str, code: Path = REPO, env: dict | None = None) -> None:
        full_env = user_environment(code=code)
        full_env.update(env or {})
        self.lines: list[str] = []
        self.times: list[float] = []  # when each line was read (monotonic)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fullthrottle", *args],
            cwd=code,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.times.append(time.monotonic())
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.lines[-n:])

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # pgid == pid: start_new_session=True
        self.proc.wait(timeout=60)
        self._reader.join(timeout=10)

    def finish(self, timeout: float) -> int:
        """Waits for the exit; kills the process group and fails the test after ``timeout`` s."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the run did not end in {timeout} s:\n{self.tail()}")
        self._reader.join(timeout=10)
        return self.proc.returncode


def last_run(output_dir: Path) -> dict:
    return json.loads((output_dir / "last_run.json").read_text())


def eval_split_examples(last: dict, limit: int | None = None) -> list[bytes]:
    """Serialized raw tf.Examples of ExampleGen's eval split (held out from training)."""
    pattern = os.path.join(last["pipeline_root"], "*ExampleGen", "examples", "*", "Split-eval", "*")
    files = sorted(glob.glob(pattern))
    assert files, f"no eval split under {pattern}"
    records = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    return records[:limit] if limit else records


def label_of(serialized: bytes, label: str) -> str:
    example = tf.train.Example.FromString(serialized)
    feature = example.features.feature[label]
    if feature.bytes_list.value:
        return feature.bytes_list.value[0].decode()
    if feature.int64_list.value:
        return str(feature.int64_list.value[0])
    return str(feature.float_list.value[0])


def strip_label(serialized: bytes, label: str) -> bytes:
    example = tf.train.Example.FromString(serialized)
    del example.features.feature[label]
    return example.SerializeToString()


def served_dirs(serving_dir: Path) -> list[Path]:
    if not serving_dir.exists():
        return []
    return sorted(p for p in serving_dir.iterdir() if p.is_dir() and p.name.isdigit())


# The stock steps every run has; the schema step's id depends on whether the schema is imported.
CORE_COMPONENTS = (
    "ArrowExampleGen",
    "StatisticsGen",
    "ExampleValidator",
    "Transform",
    "Trainer",
    "Evaluator",
    "Pusher",
)


def assert_all_components_completed(last: dict) -> None:
    """Every node of the pipeline ran (none cached, none skipped), the core ones included."""
    from fullthrottle.core.config import Config, validate_section
    from pipelines.local_runner import build_local_pipeline

    config = validate_section(Config, last["config"])
    pipeline = build_local_pipeline(config, input_base=str(config.staged_data_dir))
    node_ids = {component.id for component in pipeline.components}
    assert set(CORE_COMPONENTS) <= node_ids
    assert set(last["components"]) == node_ids, (sorted(last["components"]), sorted(node_ids))
    for component, record in last["components"].items():
        assert record["state"] == "complete", (component, last["components"])


def leftovers(tmpdir: Path) -> list[str]:
    """Everything a run left in its temp folder. Without the run's scratch temp folder, TFX and
    Beam leave folders there on every run (13 empty ones for a default run: Beam's job-server
    and pipeline temp folders, TFX executors' temp folders) and, when given Beam arguments, an
    sdist of TFX itself per Beam component (~50 MB each) with Beam's staging lists for it."""
    return sorted(str(p.relative_to(tmpdir)) for p in tmpdir.rglob("*"))
