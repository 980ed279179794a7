"""Spawning `python -m tests.training_worker` processes for the slow training tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def spawn(spec: dict, spec_path: Path, *, tf_config: dict | None = None, log: Path | None = None):
    """Start a worker process for ``spec``; stdout/stderr go to ``log`` (default beside spec)."""
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Workers may be SIGKILLed (resume tests): what they would remove at exit (autograph's
    # generated files) stays in a temp folder of their own, beside the spec in the test's tmp.
    temp = spec_path.parent / f"{spec_path.stem}-tmp"
    temp.mkdir(exist_ok=True)
    env["TMPDIR"] = str(temp)
    log = log or spec_path.with_suffix(".log")
    out = open(log, "w")  # noqa: SIM115 - closed with the process by the caller via finish()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.training_worker", str(spec_path)],
        env=env,
        cwd=str(REPO),
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    proc.log_path = log  # type: ignore[attr-defined]
    proc.log_file = out  # type: ignore[attr-defined]
    return proc


def finish(proc, timeout: float) -> str:
    """Wait for ``proc``; return its log. Kills it (by its own pid) on timeout."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.log_file.close()
    return Path(proc.log_path).read_text()


def tail(text: str, n: int = 40) -> str:
    return "\n".join(text.splitlines()[-n:])
