"""A real `mlflow server` process for the tracking tests: SQLite backend, 127.0.0.1, a free port.

Started in its own session so that stopping it (SIGKILL to its process group: the server and its
uvicorn workers) leaves nothing behind, and so that a test can make it vanish mid-run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fullthrottle.tracking.store import seed_sqlite_store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_sqlite_store(folder: Path) -> str:
    """The URI of a new SQLite store `folder/mlflow.db`, made as a fullthrottle run makes its
    own (a copy of an empty store, see `seed_sqlite_store`)."""
    seed_sqlite_store(folder / "mlflow.db", (folder / "artifacts").as_uri())
    return f"sqlite:///{folder / 'mlflow.db'}"


class MlflowServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        (root / "tmp").mkdir(exist_ok=True)
        # As a fullthrottle run starts its own store: a copy of an empty one, not MLflow's
        # migrations (the server's default artifact root is its proxy, `mlflow-artifacts:/`).
        seed_sqlite_store(root / "mlflow.db", "mlflow-artifacts:/")
        self._log = open(root / "server.log", "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                f"sqlite:///{root / 'mlflow.db'}",
                "--artifacts-destination",
                str(root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],  # fmt: skip
            cwd=root,
            # Its temp files (MLflow's db_init_lock-* files, uploads) stay in its own folder.
            env={**os.environ, "TMPDIR": str(root / "tmp")},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_healthy(timeout=120)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited: {(self.root / 'server.log').read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer within {timeout} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self._log.close()
