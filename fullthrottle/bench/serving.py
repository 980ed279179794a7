"""Serving benchmark: concurrent REST clients against `fullthrottle serve` vs the SavedModel in process.

`run_serving_benchmark` starts `fullthrottle serve` on a free 127.0.0.1 port over a push folder,
sends `requests` predict calls (one serialized tf.Example each, `serving_default`) from
`concurrency` client threads, and reports requests/s, p50/p99 latency and the error count; then
calls the SavedModel's signature in process the same number of times from the same number of
threads for comparison. Numbers are for comparing within one run on one machine only.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# Output files of the servers `start_server` started, by process id, until `stop_server`.
_SERVER_LOGS: dict[int, Any] = {}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(
    serving_dir: str,
    *,
    model_name: str,
    port: int,
    overrides: Sequence[str] = (),
    timeout: float = 120.0,
) -> subprocess.Popen:
    """Starts `fullthrottle serve` and waits until its status route answers; kills it on failure."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    command = [
        sys.executable,
        "-m",
        "fullthrottle",
        "serve",
        "--model-dir",
        serving_dir,
        "--model-name",
        model_name,
    ]
    command += ["--port", str(port), "--engine", "kserve"]
    for override in overrides:
        command += ["--set", override]
    # The server's output goes to an unnamed temporary file, never to a pipe: a pipe nobody reads
    # fills up (64 KiB) and the server then blocks in its next log write, on the event loop
    # thread, so every request hangs (seen as hot swaps that never finished).
    log_file = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True
    )
    _SERVER_LOGS[process.pid] = log_file
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{port}/v1/models/{model_name}"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = stop_server(process)
            raise RuntimeError(
                f"fullthrottle serve exited with {process.returncode}:\n{output[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return process
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    stop_server(process)
    raise RuntimeError(f"fullthrottle serve did not answer {url} within {timeout} s")


def stop_server(process: subprocess.Popen) -> str:
    """Stops a server started by `start_server` (its own process only) and returns its output."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    log_file = _SERVER_LOGS.pop(process.pid, None)
    if log_file is None:
        return ""
    with log_file:
        log_file.seek(0)
        return log_file.read()


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def _run_concurrently(call: Any, *, requests: int, concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    counter = iter(range(requests))

    def worker() -> None:
        while True:
            with lock:
                index = next(counter, None)
            if index is None:
                return
            started = time.perf_counter()
            try:
                call(index)
            except Exception as exc:  # noqa: BLE001 - counted and reported, not hidden
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            elapsed = time.perf_counter() - started
            with lock:
                latencies.append(elapsed)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    wall = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - wall
    return {
        "requests": requests,
        "concurrency": concurrency,
        "errors": len(errors),
        "first_errors": errors[:3],
        "seconds": wall,
        "requests_per_second": len(latencies) / wall if wall > 0 else 0.0,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else None,
        "p99_ms": 1000 * _percentile(latencies, 0.99) if latencies else None,
    }


def run_serving_benchmark(
    *,
    serving_dir: str,
    examples: Sequence[bytes],
    model_name: str = "penguins",
    requests: int = 2000,
    concurrency: int = 16,
) -> dict[str, Any]:
    """Benchmarks `fullthrottle serve` on `serving_dir` and the newest SavedModel in process.

    `examples` are serialized tf.Examples without the label (one per request, cycled). Returns
    ``{"server": {...}, "in_process": {...}, "version": ..., "server_vs_in_process": ratio}``,
    each part with requests/s, p50/p99 in ms and the error count.
    """
    import tensorflow as tf

    from serving.push import version_dirs

    if not examples:
        raise ValueError("run_serving_benchmark needs at least one serialized tf.Example")
    versions = version_dirs(serving_dir)
    if not versions:
        raise FileNotFoundError(f"no version folder in {serving_dir}")
    newest = max(versions)
    bodies = [
        json.dumps({"instances": [{"b64": base64.b64encode(e).decode()}]}).encode()
        for e in examples
    ]
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/models/{model_name}:predict"

    def rest_call(index: int) -> None:
        request = urllib.request.Request(
            url,
            data=bodies[index % len(bodies)],
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            payload = json.loads(response.read())
        if "predictions" not in payload:
            raise RuntimeError(f"no predictions in {payload}")

    server = start_server(serving_dir, model_name=model_name, port=port)
    try:
        rest_call(0)  # first request outside the timing
        server_stats = _run_concurrently(rest_call, requests=requests, concurrency=concurrency)
    finally:
        stop_server(server)

    signature = tf.saved_model.load(versions[newest]).signatures["serving_default"]
    tensors = [tf.constant([e]) for e in examples]

    def local_call(index: int) -> None:
        signature(examples=tensors[index % len(tensors)])

    local_call(0)
    local_stats = _run_concurrently(local_call, requests=requests, concurrency=concurrency)
    ratio = (
        server_stats["requests_per_second"] / local_stats["requests_per_second"]
        if local_stats["requests_per_second"]
        else None
    )
    return {
        "version": newest,
        "server": server_stats,
        "in_process": local_stats,
        "server_vs_in_process": ratio,
    }
