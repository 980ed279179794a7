"""`fullthrottle serve`: answer TF Serving's REST and gRPC APIs for the pushed model here.

With `tensorflow_model_server` on PATH (and `--engine auto`), it runs TF Serving itself on the
push folder; otherwise KServe's model server (`serving/server.py`). Both load the newest complete
version and pick up new pushes without a restart.

Version labels are `serving.version_labels` plus the MLflow registry alias
(`tracking.registry_alias`, ``champion`` by default) as a label of the same name: the alias
names a registered model version, whose ``push_version`` tag is the version folder. The server
may not import the tracking layer, so this command reads the alias through MLflow's client and
hands the server a function returning label -> version, which the server asks at every poll; a
moved alias moves the label within `serving.poll_seconds`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fullthrottle.commands.options import add_config_arguments, config_from_args
from fullthrottle.core import exit_status
from fullthrottle.core.config import Config, check_name
from fullthrottle.core.errors import ConfigError, ServingError


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "serve",
        help="serve the pushed model over TF Serving's REST and gRPC APIs (KServe model server)",
        description=(
            "Loads the newest complete versions from <output_dir>/serving/<model_name>/ and "
            "answers TF Serving's REST API (/v1/models/<name>[/versions/<v>|/labels/<l>] "
            ":predict, :classify, :regress, status, /metadata) and its gRPC PredictionService and "
            "ModelService on --grpc-port. Labels are serving.version_labels and the MLflow "
            "alias (tracking.registry_alias). New pushes and moved labels are picked up without "
            "a restart. Runs tensorflow_model_server instead when it is on PATH (--engine auto)."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle serve\n"
            "  fullthrottle serve --output-dir runs --port 9000 --grpc-port 9001\n"
            "  fullthrottle serve --model-dir /srv/models/penguins --model-name penguins\n"
            "  fullthrottle serve --set serving.version_labels.stable=1796191994"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--model-dir", help="the push folder holding <version>/ folders (default: from the config)"
    )
    parser.add_argument(
        "--model-name", help="the name in the URL (default: the config's model_name)"
    )
    parser.add_argument("--host", help="address to listen on (default: serving.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="REST port (default: serving.rest_port, 8501)")
    parser.add_argument(
        "--grpc-port",
        type=int,
        help="TF Serving gRPC port (default: serving.grpc_port, 8500; 0 serves REST only)",
    )
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="log one line per request (off by default, as in TF Serving; KServe engine only)",
    )
    parser.add_argument(
        "--engine",
        choices=("auto", "kserve", "tfserving"),
        default="auto",
        help="auto: tensorflow_model_server when on PATH, else KServe's model server",
    )
    return parser


def serving_target(args: argparse.Namespace, config: Config) -> tuple[Path, str, str, int]:
    model_dir = Path(args.model_dir).absolute() if args.model_dir else config.serving_dir
    model_name = args.model_name or config.model_name
    check_name(model_name, "--model-name")  # it becomes a URL path segment: no '/', no '..'
    host = args.host or config.serving.host
    port = config.serving.rest_port if args.port is None else args.port
    if not 0 < port <= 65535:
        raise ConfigError(f"--port must be within [1, 65535], got {port}")
    return model_dir, model_name, host, port


def grpc_target(args: argparse.Namespace, config: Config, *, rest_port: int) -> int:
    port = config.serving.grpc_port if args.grpc_port is None else args.grpc_port
    if not 0 <= port <= 65535:
        raise ConfigError(f"--grpc-port must be within [0, 65535] (0: no gRPC), got {port}")
    if port == rest_port:
        raise ConfigError(f"the REST and gRPC ports must differ, both are {port}")
    return port


def alias_reader(config: Config) -> Callable[[], dict[str, int]] | None:
    """label -> version from the MLflow registry alias, or None when the config registers nothing.

    The alias is read from the model registered as `model_name`; its version's `push_version`
    tag is the version folder. No registered model, no alias, or no tag: no label (yet). The
    embedded SQLite store is only read when it exists (a client would otherwise create it).
    """
    tracking = config.tracking
    if not (tracking.enabled and tracking.register_model):
        return None
    from fullthrottle.tracking.store import resolve_destination

    destination = resolve_destination(config)
    database = Path(destination.uri.removeprefix("sqlite:///")) if destination.embedded else None
    registered_name, alias = config.model_name, tracking.registry_alias
    clients: list[Any] = []

    def read() -> dict[str, int]:
        if database is not None and not database.is_file():
            return {}
        from mlflow.exceptions import MlflowException

        if not clients:
            from mlflow import MlflowClient

            clients.append(MlflowClient(tracking_uri=destination.uri, registry_uri=destination.uri))
        try:
            holder = clients[0].get_model_version_by_alias(registered_name, alias)
        except MlflowException as exc:
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return {}
            raise
        push_version = (holder.tags or {}).get("push_version", "")
        return {alias: int(push_version)} if push_version.isdigit() else {}

    return read


def label_source(config: Config) -> Callable[[], dict[str, int]]:
    """The server's labels: `serving.version_labels`, plus the MLflow alias unless a static
    label has its name (the config wins: it is what the operator wrote down)."""
    static = dict(config.serving.version_labels)
    from_alias = alias_reader(config)

    def labels() -> dict[str, int]:
        found = from_alias() if from_alias is not None else {}
        return {**found, **static}

    return labels


def alias_labels(config: Config) -> Callable[[], dict[str, int]]:
    """The MLflow alias as a label (none when the config registers no model)."""
    from_alias = alias_reader(config)
    return from_alias if from_alias is not None else dict


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    model_dir, model_name, host, port = serving_target(args, config)
    grpc_port = grpc_target(args, config, rest_port=port)
    from serving.push import version_dirs
    from serving.servables import is_complete

    complete = [v for v, p in version_dirs(model_dir).items() if is_complete(p)]
    if not complete:
        raise ServingError(
            f"no complete model version in {model_dir} (expected <integer>/saved_model.pb); push one "
            "with `fullthrottle run`, or point --model-dir/--output-dir at a push folder"
        )
    binary = shutil.which("tensorflow_model_server")
    if args.engine == "tfserving" and binary is None:
        raise ServingError(
            "--engine tfserving: tensorflow_model_server is not on PATH; use --engine kserve"
        )
    if binary and args.engine in ("auto", "tfserving"):
        return _exec_tf_serving(
            binary,
            config=config,
            model_dir=model_dir,
            model_name=model_name,
            port=port,
            grpc_port=grpc_port,
        )
    _check_port_free(host, port)
    if grpc_port:
        _check_port_free(host, grpc_port)
    from serving.server import run_server

    run_server(
        serving_dir=str(model_dir),
        model_name=model_name,
        host=host,
        port=port,
        grpc_port=grpc_port,
        max_request_bytes=config.serving.max_request_bytes,
        poll_seconds=config.serving.poll_seconds,
        serve_versions=config.serving.serve_versions,
        version_labels=config.serving.version_labels,
        label_source=alias_labels(config),
        grpc_max_message_bytes=config.serving.grpc_max_message_bytes,
        access_log=args.access_log,
    )
    return exit_status.SUCCESS


def _check_port_free(host: str, port: int) -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ServingError(
                f"cannot listen on {host}:{port}: {exc.strerror}; choose another --port or stop the other server"
            ) from None


def _exec_tf_serving(
    binary: str, *, config: Config, model_dir: Path, model_name: str, port: int, grpc_port: int
) -> int:
    """Replaces this process with TF Serving on the same folder, ports, labels and batching.

    Not exercised here (no tensorflow_model_server binary can be installed on these machines).
    TF Serving has no REST bind-address flag: it listens on all interfaces. Its labels are the
    ones known now (the MLflow alias is read once); TF Serving re-reads the model config file
    every 60 s, so `fullthrottle deploy-kit` or this command can rewrite it.
    """
    from serving.deploy_kit import batching_parameters, model_config_text

    batching_file = model_dir.parent / f".{model_name}.batching.config"
    batching_file.write_text(batching_parameters(config.serving), encoding="utf-8")
    try:
        labels = label_source(config)()
    except Exception as exc:  # noqa: BLE001 - TF Serving still serves; only the alias label is lost
        labels = dict(config.serving.version_labels)
        print(
            f"fullthrottle serve: note: the MLflow alias could not be read ({exc}); "
            "serving.version_labels only",
            file=sys.stderr,
        )
    config_file = model_dir.parent / f".{model_name}.models.config"
    config_file.write_text(
        model_config_text(
            model_name=model_name,
            base_path=str(model_dir),
            serve_versions=config.serving.serve_versions,
            labels=labels,
        ),
        encoding="utf-8",
    )
    argv = [
        binary,
        f"--port={grpc_port or config.serving.grpc_port}",
        f"--rest_api_port={port}",
        f"--model_config_file={config_file}",
        "--model_config_file_poll_wait_seconds=60",
        f"--file_system_poll_wait_seconds={max(1, round(config.serving.poll_seconds))}",
        "--enable_batching=true",
        f"--batching_parameters_file={batching_file}",
        "--enable_model_warmup=true",
    ]
    print("fullthrottle serve: running " + " ".join(argv), file=sys.stderr, flush=True)
    os.execv(binary, argv)
    return exit_status.SUCCESS  # not reached
