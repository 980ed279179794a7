"""Shared test set-up.

TensorFlow fixes its device list at first use, so the two logical CPU devices that the
distribution tests need (MirroredStrategy over 2 replicas without a GPU) are configured here,
before any test imports a model. Code under test that asks for 2 logical devices finds them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)


import pytest  # noqa: E402

from tests.helpers import once_per_session, run_cli  # noqa: E402

MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")


# Session fixtures that are whole pipeline runs: a test that asks for one is `slow` (not part of
# `make test-fast`) whether or not it says so.
PIPELINE_RUN_FIXTURES = ("penguins_run",)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    """The longest modules first: tests/module_seconds.json holds each module's seconds (its
    tests' times summed, from a full run's `--junitxml`; roughly right is enough), and a module
    not listed there, a new one, goes first of all.

    `make test` gives each xdist worker whole modules (`--dist loadscope`, in collection order:
    `--no-loadscope-reorder`); a long module handed out last keeps one worker busy while the
    other has nothing left to do. Longest first, the short modules at the end fill both workers
    until the last minute. Each module's tests keep their order."""
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in PIPELINE_RUN_FIXTURES):
            item.add_marker(pytest.mark.slow)
    seconds = json.loads(MODULE_SECONDS.read_text(encoding="utf-8"))
    by_module: dict[str, list] = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(by_module, key=lambda module: -seconds.get(module, float("inf")))
    items[:] = [item for module in order for item in by_module[module]]


@pytest.fixture(autouse=True)
def _tracking_uri_left_as_found():
    """A test that leaves MLflow's tracking URI set (`mlflow.set_tracking_uri` exports it as
    $MLFLOW_TRACKING_URI) sends every later run of its worker to that store, with artifacts in
    the working directory's `./mlruns`: the test that did it fails, and the URI is restored."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    after = os.environ.get("MLFLOW_TRACKING_URI")
    if after != before:
        import mlflow

        mlflow.set_tracking_uri(before)
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        pytest.fail(f"the test left MLFLOW_TRACKING_URI set to {after!r} (was {before!r})")


@pytest.fixture(scope="session")
def penguins_run(tmp_path_factory):
    """One real pipeline run on the bundled penguins data, shared by the tests that read it (and
    by every xdist worker)."""

    def create(folder: Path) -> dict:
        output_dir = folder / "out"
        # Its own temp folder, so tests can check what a run leaves behind there (result.tmpdir).
        tmpdir = folder / "tmp"
        tmpdir.mkdir()
        result = run_cli(
            "run", "--output-dir", str(output_dir), "--set", "training.train_steps=300",
            env={"TMPDIR": str(tmpdir)},
        )  # fmt: skip
        assert result.returncode == 0, (
            f"fullthrottle run failed:\n{result.stdout}\n{result.stderr[-5000:]}"
        )
        return {
            "output_dir": str(output_dir),
            "returncode": result.returncode,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "tmpdir": str(tmpdir),
        }

    run = once_per_session(tmp_path_factory, "penguins_run", create)
    result = SimpleNamespace(**{k: v for k, v in run.items() if k != "output_dir"})
    return Path(run["output_dir"]), result
