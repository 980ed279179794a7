"""`fullthrottle ui`: the MLflow UI on the run's own store, bound to 127.0.0.1."""

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


def test_ui_serves_the_runs_store_on_loopback_only(penguins_run):
    output_dir, _ = penguins_run
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fullthrottle",
            "ui",
            "--output-dir",
            str(output_dir),
            "--port",
            str(port),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name?experiment_name=fullthrottle-penguins"
        deadline = time.monotonic() + 120
        answer = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    answer = json.loads(response.read())
                    break
            except OSError:
                time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert answer is not None, "the UI did not answer within 120 s"
        # The store is the run's own: the pipeline's experiment is there.
        assert answer["experiment"]["name"] == "fullthrottle-penguins"
        listening = [
            c.laddr
            for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            for c in p.connections(kind="tcp")  # psutil in the lock predates net_connections
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        ]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
