"""`fullthrottle serve`: KServe's model server answering TF Serving's REST API.

The HTTP and protocol side is KServe's (`kserve.ModelServer`'s FastAPI app, data plane, model
registry, error handlers, V1 protocol: ``POST /v1/models/<name>:predict``, ``GET /v1/models``).
This module adds only what TF Serving has and KServe's V1 lacks:

- versions: ``POST /v1/models/<name>/versions/<v>:predict`` and TF Serving's status reply for
  ``GET /v1/models/<name>[/versions/<v>]`` (``model_version_status``);
- TF Serving's metadata reply, ``GET /v1/models/<name>[/versions/<v>]/metadata``: each served
  signature's inputs and outputs with their dtypes and shapes, so clients can type their values
  (`fullthrottle predict` reads it to send int64 columns as int64);
- a request-size limit (413 with ``{"error": ...}``);
- `VersionedModels`: loads the newest complete versions from the push folder, replays each
  version's warmup records before it takes traffic, and swaps versions in one assignment, so a
  request is answered by either the old or the new version and never fails on the switch.

Model names and versions from a request are looked up in memory, never joined into a path.

Per-request log lines (uvicorn's access log, KServe's timing trace) are off unless asked for:
about 400 bytes per request written to a pipe nobody drains is how a server stops answering
(measured: the hot-swap test's server blocked in a log write after ~150 requests once its
stdout pipe was full; TF Serving does not log requests either).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving.push import WARMUP_RELATIVE_PATH, replay_warmup, version_dirs
from serving.rest_protocol import RequestError, decode_predict_request, encode_predict_response
from serving.signatures import PREDICT_TRANSFORMED, TRANSFORM_FEATURES

log = logging.getLogger("fullthrottle.serve")
VERSION_HEADER = "x-fullthrottle-model-version"
# Signatures a REST client may call. transform_features and predict_transformed are internal
# (the Evaluator and the TFLite export use them), as TF Serving would still expose them, but
# they take transformed tensors or labels that clients do not have.
_HIDDEN_SIGNATURES = (TRANSFORM_FEATURES, PREDICT_TRANSFORMED)


@dataclass(frozen=True)
class LoadedVersion:
    version: int
    path: str
    signatures: Mapping[str, Any]  # name -> concrete function
    input_specs: Mapping[str, Mapping[str, tf.TensorSpec]]
    warmup_records: int


def is_complete(path: str) -> bool:
    """A version folder TF Serving could load: saved_model.pb and, if any, the variables index."""
    if not os.path.isfile(os.path.join(path, "saved_model.pb")):
        return False
    variables = os.path.join(path, "variables")
    return not os.path.isdir(variables) or os.path.isfile(
        os.path.join(variables, "variables.index")
    )


def load_version(version: int, path: str) -> LoadedVersion:
    """Loads one version and replays its warmup records (as TF Serving does) before it serves."""
    loaded = tf.saved_model.load(path)
    all_signatures = dict(loaded.signatures)
    signatures = {name: fn for name, fn in all_signatures.items() if name not in _HIDDEN_SIGNATURES}
    input_specs = {name: dict(fn.structured_input_signature[1]) for name, fn in signatures.items()}
    warmup_path = os.path.join(path, WARMUP_RELATIVE_PATH)
    warmed = 0
    if os.path.isfile(warmup_path):
        records = [r.numpy() for r in tf.data.TFRecordDataset(warmup_path)]
        # Replayed on the object loaded above: the warmed functions are the ones that serve.
        warmed = replay_warmup(path, records, loaded=loaded)
    # Keep the loaded object alive: the signatures reference its variables.
    return LoadedVersion(version, path, _KeepAlive(signatures, loaded), input_specs, warmed)


class _KeepAlive(dict):
    """A dict of signatures that also holds the loaded SavedModel object they belong to."""

    def __init__(self, signatures: Mapping[str, Any], owner: Any) -> None:
        super().__init__(signatures)
        self.owner = owner


class VersionedModels:
    """The loaded versions of one model, refreshed from its push folder.

    Owns: which versions are loaded (the newest `serve_versions` complete ones) and the switch.
    Refuses: folders that are not integers (staging, deleting), incomplete folders, versions that
    fail to load or to answer their warmup (logged, skipped, not retried).
    """

    def __init__(self, serving_dir: str, *, serve_versions: int) -> None:
        self.serving_dir = serving_dir
        self.serve_versions = serve_versions
        self._loaded: dict[int, LoadedVersion] = {}
        self._failed: set[int] = set()
        self._lock = threading.Lock()  # one refresh at a time; readers never take it

    @property
    def versions(self) -> dict[int, LoadedVersion]:
        return self._loaded  # replaced, never mutated: a reader sees one consistent set

    def newest(self) -> LoadedVersion | None:
        loaded = self._loaded
        return loaded[max(loaded)] if loaded else None

    def refresh(self) -> list[int]:
        """Loads new complete versions, unloads versions beyond the newest N; returns new ones."""
        with self._lock:
            candidates = {
                v: p
                for v, p in version_dirs(self.serving_dir).items()
                if v not in self._failed and is_complete(p)
            }
            wanted = sorted(candidates, reverse=True)[: self.serve_versions]
            current = self._loaded
            updated = {v: current[v] for v in wanted if v in current}
            new = []
            for version in wanted:
                if version in updated:
                    continue
                try:
                    updated[version] = load_version(version, candidates[version])
                    new.append(version)
                except Exception as exc:  # noqa: BLE001 - a bad version must not stop serving the good one
                    self._failed.add(version)
                    log.error(
                        "version %s in %s cannot be served, skipped: %s",
                        version,
                        self.serving_dir,
                        exc,
                    )
            if not updated and current:
                return []  # nothing loadable now (e.g. the folder was emptied): keep serving
            self._loaded = updated  # the switch: one assignment
            return new


def predict(
    models: VersionedModels, body: Any, *, version: int | None
) -> tuple[dict[str, Any], int]:
    """Answers one predict body; returns (response body, version that answered)."""
    if isinstance(body, (bytes, str)):
        # KServe leaves bodies with a non-JSON content type undecoded; TF Serving reads any body
        # as JSON (curl -d sends form encoding), so we do too.
        import orjson

        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise RequestError(f"the request body is not JSON: {exc}") from None
    loaded = models.versions
    if version is None:
        if not loaded:
            raise LookupError("no version is loaded yet")
        chosen = loaded[max(loaded)]
    else:
        if version not in loaded:
            raise LookupError(f"version {version} is not served; served versions: {sorted(loaded)}")
        chosen = loaded[version]
    request = decode_predict_request(body, signatures=chosen.input_specs)
    function = chosen.signatures[request.signature]
    try:
        outputs = function(**{name: tf.constant(array) for name, array in request.inputs.items()})
    except tf.errors.InvalidArgumentError as exc:
        # e.g. a serialized tf.Example whose feature types differ from the model's raw schema.
        first = str(exc).strip().splitlines()
        detail = next(
            (line for line in first if "Key:" in line or "Feature:" in line),
            first[0] if first else "",
        )
        raise RequestError(
            f"the model refused the input of signature {request.signature!r}: {detail.strip()}"
        ) from None
    return encode_predict_response(outputs, row_format=request.row_format), chosen.version


def version_status(models: VersionedModels, version: int | None = None) -> dict[str, Any]:
    """TF Serving's `GET /v1/models/<name>` reply."""
    loaded = models.versions
    versions = sorted(loaded, reverse=True) if version is None else [version]
    return {
        "model_version_status": [
            {
                "version": str(v),
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
            for v in versions
        ]
    }


def version_metadata(loaded: LoadedVersion, *, model_name: str) -> dict[str, Any]:
    """TF Serving's `GET /v1/models/<name>[/versions/<v>]/metadata` reply for one version.

    The same JSON shape TF Serving writes (a `SignatureDefMap` in proto3 JSON), for the signatures
    this server answers: input and output names, dtypes (``DT_INT64``, ...) and shapes.
    """
    from tensorflow.core.framework import types_pb2

    def tensor(spec: tf.TensorSpec, name: str) -> dict[str, Any]:
        shape = spec.shape
        return {
            "dtype": types_pb2.DataType.Name(spec.dtype.as_datatype_enum),  # DT_FLOAT, ...
            "tensor_shape": {
                "dim": []
                if shape.rank is None
                else [{"size": str(-1 if d is None else d), "name": ""} for d in shape.as_list()],
                "unknown_rank": shape.rank is None,
            },
            "name": name,
        }

    signature_defs = {}
    for signature, function in loaded.signatures.items():
        outputs = function.structured_outputs
        signature_defs[signature] = {
            "inputs": {
                name: tensor(spec, name) for name, spec in loaded.input_specs[signature].items()
            },
            "outputs": {
                name: tensor(tf.TensorSpec.from_tensor(value), name)
                if isinstance(value, tf.Tensor)
                else tensor(value, name)
                for name, value in outputs.items()
            },
            "method_name": "tensorflow/serving/predict",
        }
    return {
        "model_spec": {"name": model_name, "signature_name": "", "version": str(loaded.version)},
        "metadata": {"signature_def": {"signature_def": signature_defs}},
    }


class RequestTooLarge(Exception):
    pass


class BodySizeLimit:
    """ASGI middleware: a body over `max_bytes` gets 413 before it is read into memory whole."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _send_json(send, 413, {"error": self._message(int(declared))})
            return
        received = 0

        async def limited_receive() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:  # chunked bodies declare no length
                raise RequestTooLarge(self._message(received))
            return message

        await self.app(scope, limited_receive, send)

    def _message(self, size: int) -> str:
        return (
            f"the request body has {size} bytes, over this server's limit of {self.max_bytes} "
            "(serving.max_request_bytes); send fewer examples per request"
        )


def _client_error(status: int) -> Any:
    """An exception handler answering `status` with ``{"error": ...}``, logged as one line."""

    async def handler(_: Any, exc: Exception) -> JSONResponse:
        log.info("%s: %s", status, exc)
        return JSONResponse(status_code=status, content={"error": str(exc)})

    return handler


async def _send_json(send: Any, status: int, body: dict) -> None:
    import orjson

    payload = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def make_kserve_model(name: str, models: VersionedModels) -> Any:
    """A `kserve.Model` whose predict runs the requested signature in a worker thread."""
    import kserve
    from kserve.errors import InvalidInput, ModelNotFound

    class TFServingModel(kserve.Model):
        def __init__(self) -> None:
            super().__init__(name, return_response_headers=True)
            self.ready = models.newest() is not None

        async def predict(
            self, payload: Any, headers: dict | None = None, response_headers: dict | None = None
        ) -> dict:
            raw_version = (headers or {}).get(VERSION_HEADER)
            version = int(raw_version) if raw_version else None
            try:
                # TensorFlow releases the GIL: run the signature off the event loop so
                # concurrent requests overlap instead of queueing behind one another.
                body, answered = await asyncio.get_running_loop().run_in_executor(
                    None, lambda: predict(models, payload, version=version)
                )
            except RequestError as exc:
                raise InvalidInput(str(exc)) from None
            except LookupError as exc:
                raise ModelNotFound(f"{name} ({exc})") from None
            if response_headers is not None:
                response_headers[VERSION_HEADER] = str(answered)
            return body

    return TFServingModel()


def install_tf_serving_routes(
    app: Any, dataplane: Any, *, model_name: str, models: VersionedModels, max_request_bytes: int
) -> None:
    """Adds TF Serving's version routes and status replies to KServe's app (before its own)."""
    import orjson
    from kserve.errors import InvalidInput, ModelNotFound

    def check_name(requested: str) -> None:
        if requested != model_name:
            raise ModelNotFound(requested)

    def parse_version(text: str) -> int:
        if not text.isdigit() or len(text) > 19:
            raise InvalidInput(f"a model version is a positive integer, got {text!r}")
        return int(text)

    async def status(model_name: str) -> dict:
        check_name(model_name)
        return version_status(models)

    async def status_version(model_name: str, version: str) -> dict:
        check_name(model_name)
        number = parse_version(version)
        if number not in models.versions:
            raise ModelNotFound(f"{model_name} version {number}")
        return version_status(models, number)

    def chosen(version: str | None) -> LoadedVersion:
        loaded = models.versions
        if version is None:
            if not loaded:
                raise ModelNotFound(f"{model_name} (no version is loaded yet)")
            return loaded[max(loaded)]
        number = parse_version(version)
        if number not in loaded:
            raise ModelNotFound(f"{model_name} version {number}")
        return loaded[number]

    async def metadata(model_name: str) -> dict:
        check_name(model_name)
        return version_metadata(chosen(None), model_name=model_name)

    async def metadata_version(model_name: str, version: str) -> dict:
        check_name(model_name)
        return version_metadata(chosen(version), model_name=model_name)

    async def predict_version(model_name: str, version: str, request: Request) -> Any:
        check_name(model_name)
        number = parse_version(version)
        body = await request.body()
        headers = dict(request.headers.items())
        headers[VERSION_HEADER] = str(number)
        decoded, _ = dataplane.decode(body=body, headers=headers)
        response, response_headers = await dataplane.infer(
            model_name=model_name, request=decoded, headers=headers
        )
        response_headers.pop("content-length", None)
        # orjson, as KServe's own V1 route: a NaN output becomes null instead of a 500.
        return Response(
            content=orjson.dumps(response),
            media_type="application/json",
            headers=response_headers,
        )

    async def too_large(_: Any, exc: RequestTooLarge) -> JSONResponse:
        return JSONResponse(status_code=413, content={"error": str(exc)})

    async def http_error(_: Any, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown paths and methods: TF Serving's {"error": ...} shape instead of {"detail": ...}.
        return JSONResponse(
            status_code=exc.status_code,
            content={"error": f"{exc.detail}: see /v1/models/{model_name}"},
        )

    # FastAPI matches routes in registration order: these come before KServe's V1 routes.
    app.add_api_route(
        "/v1/models/{model_name}/versions/{version}:predict",
        predict_version,
        methods=["POST"],
        response_model=None,
    )
    app.add_api_route(
        "/v1/models/{model_name}/versions/{version}/metadata", metadata_version, methods=["GET"]
    )
    app.add_api_route("/v1/models/{model_name}/metadata", metadata, methods=["GET"])
    app.add_api_route("/v1/models/{model_name}/versions/{version}", status_version, methods=["GET"])
    app.add_api_route("/v1/models/{model_name}", status, methods=["GET"])
    app.add_exception_handler(RequestTooLarge, too_large)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes)


def run_server(
    *,
    serving_dir: str,
    model_name: str,
    host: str,
    port: int,
    max_request_bytes: int,
    poll_seconds: float,
    serve_versions: int,
    access_log: bool = False,
) -> None:
    """Serves until SIGINT/SIGTERM. Raises FileNotFoundError when no complete version exists.

    `access_log` turns on one log line per request (uvicorn's access log and KServe's timing
    trace); off, only start-up, version switches and errors are logged.
    """
    models = VersionedModels(serving_dir, serve_versions=serve_versions)
    models.refresh()
    newest = models.newest()
    if newest is None:
        raise FileNotFoundError(serving_dir)
    # kserve.model_server parses sys.argv when imported; our own flags are not its flags.
    saved_argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
        from kserve.errors import InvalidInput, ModelNotFound
        from kserve.model_server import ModelServer, app
        from kserve.protocol.rest.server import RESTServer
    finally:
        sys.argv = saved_argv

    server = ModelServer(http_port=port, enable_grpc=False, workers=1, enable_latency_logging=False)
    if not access_log:
        # ModelServer configured KServe's logging just now; these two loggers write per request.
        for name in ("uvicorn.access", "kserve.trace"):
            logging.getLogger(name).setLevel(logging.WARNING)
    server.register_model(make_kserve_model(model_name, models))
    install_tf_serving_routes(
        app,
        server.dataplane,
        model_name=model_name,
        models=models,
        max_request_bytes=max_request_bytes,
    )

    class TFServingRESTServer(RESTServer):
        """KServe's REST server, except that a client's mistake (4xx) logs no stack trace."""

        def _add_exception_handlers(self, fastapi_app: Any) -> None:
            super()._add_exception_handlers(fastapi_app)
            # KServe logs every InvalidInput / ModelNotFound with its traceback at ERROR: a bad
            # request would fill the log with server-side traces of nothing wrong on the server.
            fastapi_app.add_exception_handler(InvalidInput, _client_error(400))
            fastapi_app.add_exception_handler(ModelNotFound, _client_error(404))

    rest = TFServingRESTServer(
        FASTAPI_APP_IMPORT_STRING,
        server.dataplane,
        server.model_repository_extension,
        port,
        workers=1,
        grace_period=5,
    )
    rest.config.host = host  # KServe binds 0.0.0.0; we serve where the config says

    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(poll_seconds):
            try:
                for version in models.refresh():
                    print(
                        f"fullthrottle serve: now serving {model_name} version {version}",
                        file=sys.stderr,
                        flush=True,
                    )
            except Exception as exc:  # noqa: BLE001 - a failed scan is retried at the next poll
                log.error("scanning %s failed: %s", serving_dir, exc)

    threading.Thread(target=poll, name="version-poller", daemon=True).start()
    print(
        f"fullthrottle serve: serving {model_name} version {newest.version} from {serving_dir} at "
        f"http://{host}:{port}/v1/models/{model_name} (KServe model server, TF Serving REST API)",
        file=sys.stderr,
        flush=True,
    )
    try:
        asyncio.run(rest.start())
    finally:
        stop.set()
