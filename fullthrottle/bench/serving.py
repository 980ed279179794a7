"""Serving benchmark: `fullthrottle serve` under load, against the SavedModel in process.

`run_serving_benchmark` starts `fullthrottle serve` on a free 127.0.0.1 port over a push folder,
sends `requests` predict calls (one serialized tf.Example each, `serving_default`) from
`concurrency` client threads, and reports requests/s, p50/p99 latency and the error count; then
calls the SavedModel's signature in process the same number of times from the same number of
threads for comparison.

`run_switch_benchmark` is the version switch under load: REST and gRPC clients (the official
`tensorflow-serving-api` stubs) loop on the ``champion`` label while a new version is pushed and
the MLflow alias, and with it the label, moves to it. It reports p50/p99 and failures per
protocol and which versions answered. Numbers are for comparing within one run on one machine.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
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
    grpc_port: int = 0,
    config_file: str | None = None,
    overrides: Sequence[str] = (),
    timeout: float = 120.0,
) -> subprocess.Popen:
    """Starts `fullthrottle serve` and waits until its status route answers; kills it on failure.

    `grpc_port` 0 serves REST only (the default, so servers started side by side never contend
    for the config's gRPC port).
    """
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
    command += ["--port", str(port), "--grpc-port", str(grpc_port), "--engine", "kserve"]
    if config_file is not None:
        command += ["--config", config_file]
    for override in overrides:
        command += ["--set", override]
    # The server's output goes to an unnamed temporary file, never to a pipe: a pipe nobody reads
    # fills up (64 KiB) and the server then blocks in its next log write, on the event loop
    # thread, so every request hangs (seen as hot swaps that never finished).
    log_file = tempfile.TemporaryFile(  # noqa: SIM115 - closed when the server is stopped
        mode="w+", encoding="utf-8", errors="replace"
    )
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
    switch_seconds: float = 6.0,
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
    result = {
        "version": newest,
        "server": server_stats,
        "in_process": local_stats,
        "server_vs_in_process": ratio,
    }
    if switch_seconds > 0:
        result["switch"] = run_switch_benchmark(
            serving_dir=serving_dir,
            examples=examples,
            model_name=model_name,
            clients_per_protocol=max(1, concurrency // 2),
            seconds=switch_seconds,
        )
    return result


def _mlflow_registry(uri: str, model_name: str) -> Any:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model(model_name)
    return client


def _register(client: Any, model_name: str, version_dir: str, version: int) -> None:
    """Registers a pushed version as the pipeline's tracking does, and moves the alias to it."""
    registered = client.create_model_version(
        model_name, source=version_dir, tags={"push_version": str(version)}
    )
    client.set_registered_model_alias(model_name, SWITCH_LABEL, registered.version)


SWITCH_LABEL = "champion"


def run_switch_benchmark(
    *,
    serving_dir: str,
    examples: Sequence[bytes],
    model_name: str = "penguins",
    clients_per_protocol: int = 4,
    seconds: float = 6.0,
) -> dict[str, Any]:
    """REST and gRPC clients on the ``champion`` label while a new version and the label arrive.

    Works on a copy: the newest version of `serving_dir` is copied into a temporary push folder
    with its own MLflow registry (SQLite), registered and given the ``champion`` alias, and
    served with REST and gRPC. Clients loop for `seconds`; at a third of it the same SavedModel
    is pushed again as a new version (`push_model`, warmup included), and once the server has
    loaded it the alias moves to it. Returns per protocol ``requests``, ``errors`` (with the
    first few), ``p50_ms``/``p99_ms`` and the ``versions`` that answered, in order of first
    answer; plus ``old_version``, ``new_version`` and ``label_moved_after_s``.
    """
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from serving.push import push_model, version_dirs

    versions = version_dirs(serving_dir)
    if not versions:
        raise FileNotFoundError(f"no version folder in {serving_dir}")
    old = max(versions)
    bodies = [
        json.dumps({"instances": [{"b64": base64.b64encode(e).decode()}]}).encode()
        for e in examples
    ]
    with tempfile.TemporaryDirectory(prefix="fullthrottle-switch-") as tmp:
        root = Path(tmp)
        push_dir = root / "serving" / model_name
        shutil.copytree(versions[old], push_dir / str(old))
        uri = f"sqlite:///{root / 'mlflow.db'}"
        registry = _mlflow_registry(uri, model_name)
        _register(registry, model_name, str(push_dir / str(old)), old)
        port, grpc_port = free_port(), free_port()
        rest_url = f"http://127.0.0.1:{port}/v1/models/{model_name}/labels/{SWITCH_LABEL}:predict"
        server = start_server(
            str(push_dir),
            model_name=model_name,
            port=port,
            grpc_port=grpc_port,
            overrides=(
                f"tracking.uri={uri}",
                f"model_name={model_name}",
                "serving.poll_seconds=0.2",
            ),
        )
        records: dict[str, list[tuple[float, int]]] = {"rest": [], "grpc": []}
        errors: dict[str, list[str]] = {"rest": [], "grpc": []}
        stop = threading.Event()

        def rest_client(worker: int) -> None:
            index = worker
            while not stop.is_set():
                request = urllib.request.Request(
                    rest_url,
                    data=bodies[index % len(bodies)],
                    headers={"Content-Type": "application/json"},
                    method="POST",
                )
                started = time.perf_counter()
                try:
                    with urllib.request.urlopen(request, timeout=60) as response:
                        payload = json.loads(response.read())
                        version = int(response.headers["x-fullthrottle-model-version"])
                    if "predictions" not in payload:
                        raise RuntimeError(f"no predictions in {payload}")
                except Exception as exc:  # noqa: BLE001 - counted and reported, not hidden
                    errors["rest"].append(f"{type(exc).__name__}: {exc}")
                    continue
                finally:
                    index += 1
                records["rest"].append((time.perf_counter() - started, version))

        def grpc_client(worker: int) -> None:
            index = worker
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                while not stop.is_set():
                    request = predict_pb2.PredictRequest()
                    request.model_spec.name = model_name
                    request.model_spec.version_label = SWITCH_LABEL
                    request.inputs["examples"].CopyFrom(
                        tf.make_tensor_proto([examples[index % len(examples)]], dtype=tf.string)
                    )
                    index += 1
                    started = time.perf_counter()
                    try:
                        response = stub.Predict(request, timeout=60)
                    except grpc.RpcError as exc:
                        errors["grpc"].append(f"{exc.code().name}: {exc.details()}")
                        continue
                    records["grpc"].append(
                        (time.perf_counter() - started, response.model_spec.version.value)
                    )

        threads = [
            threading.Thread(target=client, args=(worker,))
            for client in (rest_client, grpc_client)
            for worker in range(clients_per_protocol)
        ]
        new = None
        moved_after = None
        try:
            for thread in threads:
                thread.start()
            time.sleep(seconds / 3)
            new = push_model(
                model_dir=versions[old],
                serving_dir=str(push_dir),
                model_name=model_name,
                warmup_examples=list(examples[:16]),
                warmup_count=16,
            ).version
            pushed_at = time.monotonic()
            status_url = f"http://127.0.0.1:{port}/v1/models/{model_name}/versions/{new}"
            while time.monotonic() - pushed_at < 120:
                try:
                    with urllib.request.urlopen(status_url, timeout=10):
                        break
                except (urllib.error.URLError, OSError):
                    time.sleep(0.1)
            _register(registry, model_name, str(push_dir / str(new)), new)
            moved_at = time.monotonic()
            while time.monotonic() - moved_at < 60 and not any(
                version == new for part in records.values() for _, version in part[-50:]
            ):
                time.sleep(0.05)
            moved_after = time.monotonic() - moved_at
            time.sleep(seconds / 3)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            output = stop_server(server)
        result: dict[str, Any] = {
            "old_version": old,
            "new_version": new,
            "label_moved_after_s": moved_after,
            "clients_per_protocol": clients_per_protocol,
        }
        for protocol in ("rest", "grpc"):
            latencies = [seconds_taken for seconds_taken, _ in records[protocol]]
            answered: list[int] = []
            for _, version in records[protocol]:
                if version not in answered:
                    answered.append(version)
            result[protocol] = {
                "requests": len(latencies) + len(errors[protocol]),
                "errors": len(errors[protocol]),
                "first_errors": errors[protocol][:3],
                "p50_ms": 1000 * statistics.median(latencies) if latencies else None,
                "p99_ms": 1000 * _percentile(latencies, 0.99) if latencies else None,
                "versions": answered,
            }
        if "Traceback" in output:
            result["server_traceback"] = output[output.index("Traceback") :][:3000]
        return result
