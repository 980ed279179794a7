"""`fullthrottle ui` and `fullthrottle tensorboard`: the run's own store and logs, on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_and_ask(command: list[str], port: int, path: str) -> tuple[dict, list]:
    """Starts `fullthrottle COMMAND`, waits for `path` to answer JSON; returns it and the
    addresses the command's processes listen on at `port`; stops them."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fullthrottle", *command, "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        answer = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}{path}", timeout=5
                ) as response:
                    answer = json.loads(response.read())
                    break
            except OSError:
                time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert answer is not None, f"{command[0]} did not answer within 120 s"
        listening = []
        for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
            try:
                connections = p.connections(
                    kind="tcp"
                )  # the lock's psutil predates net_connections
            except psutil.NoSuchProcess:
                continue  # a short-lived child (the server starts helpers) ended meanwhile
            listening += [
                c.laddr
                for c in connections
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port
            ]
        return answer, listening
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_ui_serves_the_runs_store_on_loopback_only(penguins_run):
    output_dir, _ = penguins_run
    port = _free_port()
    answer, listening = _serve_and_ask(
        ["ui", "--output-dir", str(output_dir)],
        port,
        "/api/2.0/mlflow/experiments/get-by-name?experiment_name=fullthrottle-penguins",
    )
    # The store is the run's own: the pipeline's experiment is there.
    assert answer["experiment"]["name"] == "fullthrottle-penguins"
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening


def test_tensorboard_shows_the_trainer_s_scalars_on_loopback_only(penguins_run):
    output_dir, _ = penguins_run
    port = _free_port()
    tags, listening = _serve_and_ask(
        ["tensorboard", "--output-dir", str(output_dir)], port, "/data/plugin/scalars/tags"
    )
    # One TensorBoard run per Trainer execution, with the loop's scalars and the eval ones.
    (run,) = [name for name in tags if name.endswith("logs/train")]
    assert {"train/loss", "train/examples_per_second", "eval/accuracy"} <= set(tags[run])
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
