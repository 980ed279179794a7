"""`fullthrottle serve`: KServe's model server answering TF Serving's REST and gRPC APIs.

KServe provides the server (its FastAPI app ``kserve.model_server.app``, `RESTServer` on
uvicorn, the model registry and data plane, `/metrics` and its V2 routes); this module adds TF
Serving's API on top, through KServe's public API only:

- one route for every ``/v1/...`` path, registered on KServe's app before KServe registers its
  own, parses the path with TF Serving's patterns (``/v1/models/<name>[/versions/<v> |
  /labels/<l>][:predict|:classify|:regress]`` and ``[/metadata]``) and answers as TF Serving
  does (`serving.rest_protocol`), errors included (``{"error": ...}`` with TF Serving's code);
- predict, classify and regress go through KServe's data plane (`DataPlane.infer`) to a
  `kserve.Model`, for REST and gRPC alike, so KServe's registry and request metrics see them;
- TF Serving's gRPC services (`serving.grpc_service`) on a second port, in the same event loop;
- a request-size limit (413), and the version poller of `serving.servables.VersionedModels`,
  which also refreshes the version labels.

`kserve.ModelServer.start` is not used, for two reasons it has no option for: it binds REST to
0.0.0.0 (this server listens where `serving.host` says, 127.0.0.1 by default) and it would start
KServe's own gRPC server (the V2 protocol) where TF Serving's belongs. So `run_server` builds
KServe's public `RESTServer` as `ModelServer.start` does, sets its uvicorn config's host, and
runs it beside the gRPC server (a test checks the server is not reachable on another loopback
address, and fails loudly if KServe stops honouring the host).

Per-request log lines (uvicorn's access log, KServe's timing trace) are off unless asked for:
about 400 bytes per request written to a pipe nobody drains is how a server stops answering.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving import rest_protocol, servables
from serving.servables import LabelSource, VersionedModels
from serving.status import StatusError, invalid_argument

log = logging.getLogger("fullthrottle.serve")
VERSION_HEADER = "x-fullthrottle-model-version"

# TF Serving's REST paths (http_rest_api_handler.cc), case-insensitive as there.
_PREDICT_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)",
    re.IGNORECASE,
)
_STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?",
    re.IGNORECASE,
)
_CALL_KEY = "fullthrottle_call"


@dataclass(frozen=True)
class Call:
    """One request for the KServe model: which servable, and the work to run on it."""

    method: str  # predict, classify, regress, metadata
    model_name: str
    version: int | None
    label: str | None
    work: Callable[[servables.LoadedVersion], Any]


class RequestTooLargeError(Exception):
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
            # Read the body to its end without keeping it, then answer: a client still sending
            # when the answer comes and the connection closes sees a broken pipe, not the 413.
            while True:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body"):
                    break
            await _send_json(send, 413, {"error": self._message(int(declared))})
            return
        received = 0

        async def limited_receive() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:  # chunked bodies declare no length
                raise RequestTooLargeError(self._message(received))
            return message

        await self.app(scope, limited_receive, send)

    def _message(self, size: int) -> str:
        return (
            f"the request body has {size} bytes, over this server's limit of {self.max_bytes} "
            "(serving.max_request_bytes); send fewer examples per request"
        )


async def _send_json(send: Any, status: int, body: dict) -> None:
    payload = rest_protocol.dumps(body)
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


def _json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(
        content=rest_protocol.dumps(body),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _error_response(exc: StatusError) -> Response:
    return _json_response(exc.http_status, {"error": exc.message})


def make_kserve_model(name: str, models: VersionedModels, executor: ThreadPoolExecutor) -> Any:
    """The `kserve.Model` every TF Serving call goes through: resolve the servable, run the work."""
    import kserve

    class TFServingModel(kserve.Model):
        def __init__(self) -> None:
            super().__init__(name, return_response_headers=True)
            self.ready = models.newest() is not None

        async def predict(
            self, payload: Any, headers: dict | None = None, response_headers: dict | None = None
        ) -> dict:
            call: Call = payload[_CALL_KEY]
            loaded = models.resolve(call.model_name, version=call.version, label=call.label)
            # TensorFlow releases the GIL: run the work off the event loop so concurrent
            # requests overlap instead of queueing behind one another.
            result = await asyncio.get_running_loop().run_in_executor(executor, call.work, loaded)
            if response_headers is not None:
                response_headers[VERSION_HEADER] = str(loaded.version)
            return {"result": result}

    return TFServingModel()


def make_dispatch(dataplane: Any, registered_name: str) -> Any:
    """Runs `work` on the servable a model spec names, through KServe's data plane."""

    async def dispatch(
        method: str,
        model_name: str,
        version: int | None,
        label: str | None,
        work: Callable[[servables.LoadedVersion], Any],
    ) -> tuple[Any, dict[str, str]]:
        call = Call(method, model_name, version, label, work)
        response, headers = await dataplane.infer(
            model_name=registered_name, request={_CALL_KEY: call}, headers={}
        )
        return response["result"], headers

    return dispatch


class _EveryPath(Convertor):
    regex = r"[\s\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


def install_tf_serving_routes(
    app: Any,
    *,
    dispatch: Any,
    models: VersionedModels,
    max_request_bytes: int,
) -> None:
    """TF Serving's REST API on KServe's app: every /v1/ path, before KServe's own routes."""

    def parse_version(text: str | None) -> int | None:
        if text is None:
            return None
        number = int(text)
        if number > 2**63 - 1:
            raise invalid_argument(f"Failed to convert version: {text}")
        return number

    async def post(path: str, request: Request) -> Response:
        match = _PREDICT_PATH.fullmatch(path)
        if not match:
            raise invalid_argument(f"Malformed request: POST {path}")
        name, version_text, label, method = match.groups()
        version = parse_version(version_text)
        body = await request.body()
        method = method.lower()

        def work(loaded: servables.LoadedVersion) -> bytes:
            document = rest_protocol.parse_body(body)
            if method == "predict":
                signature = rest_protocol.signature_name(document)
                dtypes = servables.input_dtypes(loaded, signature)
                decoded = rest_protocol.predict_inputs(document, dtypes)
                outputs = servables.predict(loaded, signature, decoded.inputs)
                answer = rest_protocol.predict_response(outputs, row_format=decoded.row_format)
            else:
                examples = rest_protocol.examples_request(document)
                serialized = servables.merge_context(examples.context, examples.examples)
                if method == "classify":
                    rows = servables.classify(loaded, examples.signature_name, serialized)
                    answer = rest_protocol.classify_response(rows)
                else:
                    values = servables.regress(loaded, examples.signature_name, serialized)
                    answer = rest_protocol.regress_response(values)
            return rest_protocol.dumps(answer)

        payload, headers = await dispatch(method, name, version, label, work)
        return Response(
            content=payload,
            media_type="application/json",
            headers={VERSION_HEADER: headers[VERSION_HEADER]},
        )

    async def get(path: str) -> Response:
        match = _STATUS_PATH.fullmatch(path)
        if not match:
            raise invalid_argument(f"Malformed request: GET {path}")
        name, version_text, label, subresource = match.groups()
        if not name:
            raise invalid_argument("Missing model name in request.")
        version = parse_version(version_text)
        if subresource:
            loaded = models.resolve(name, version=version, label=label)
            response = servables.metadata(loaded, model_name=name)
            body = _metadata_json(response)
        else:
            body = _status_json(models.status(name, version=version, label=label))
        return _json_response(200, body)

    async def v1(request: Request) -> Response:
        path = request.url.path
        try:
            if request.method == "POST":
                return await post(path, request)
            if request.method == "GET":
                return await get(path)
            raise invalid_argument(f"Malformed request: {request.method} {path}")
        except StatusError as exc:
            return _error_response(exc)
        except RequestTooLargeError as exc:
            return _json_response(413, {"error": str(exc)})
        except Exception:
            log.exception("internal error answering %s %s", request.method, path)
            return _json_response(
                500, {"error": f"internal error answering {request.method} {path}"}
            )

    async def http_error(_: Any, exc: StarletteHTTPException) -> Response:
        # Paths outside /v1/ that KServe does not serve either: TF Serving's {"error": ...}.
        return _json_response(exc.status_code, {"error": f"{exc.detail}"})

    # FastAPI matches routes in registration order: this one comes before KServe's V1 routes.
    # Starlette's `path` convertor stops at a newline (its regex is ".*"), and a model name
    # with an encoded newline would then reach KServe's V1 route: match every character.
    register_url_convertor("tf_serving_path", _EveryPath())
    app.add_api_route(
        "/v1/{rest:tf_serving_path}",
        v1,
        methods=["GET", "POST", "PUT", "DELETE", "PATCH"],
        response_model=None,
        include_in_schema=False,
    )
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes)


def _metadata_json(response: Any) -> dict[str, Any]:
    """GetModelMetadataResponse as TF Serving's REST API writes it (proto3 JSON, field names)."""
    from google.protobuf import json_format

    return json_format.MessageToDict(
        response,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


def _status_json(response: Any) -> dict[str, Any]:
    """GetModelStatusResponse as TF Serving's REST API writes it (error_code "OK" spelled out)."""
    from tensorflow_serving.apis import get_model_status_pb2

    return {
        "model_version_status": [
            {
                "version": str(entry.version),
                "state": get_model_status_pb2.ModelVersionStatus.State.Name(entry.state),
                "status": {"error_code": "OK", "error_message": ""},
            }
            for entry in response.model_version_status
        ]
    }


def _import_kserve_model_server() -> Any:
    """`kserve.model_server`, imported with this process's own flags hidden.

    KServe parses ``sys.argv`` when the module is imported (``parse_known_args``, so unknown
    flags pass), but argparse also takes unique prefixes: our ``--config FILE`` would be read
    as KServe's ``--configure_logging FILE`` and end the process. KServe reads nothing else from
    argv; every setting this server needs is passed to KServe's constructors explicitly.
    """
    saved_argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        import kserve.model_server as model_server
    finally:
        sys.argv = saved_argv
    return model_server


def endpoints_text(*, model_name: str, host: str, port: int, grpc_port: int) -> str:
    """Where the server answers, and with which of TF Serving's APIs (gRPC only when its port
    is not 0)."""
    rest = f"http://{host}:{port}/v1/models/{model_name}"
    if not grpc_port:
        return f"{rest} (KServe model server, TF Serving's REST API; gRPC off)"
    return f"{rest} and grpc://{host}:{grpc_port} (KServe model server, TF Serving's REST and gRPC APIs)"


def run_server(
    *,
    serving_dir: str,
    model_name: str,
    host: str,
    port: int,
    grpc_port: int,
    max_request_bytes: int,
    poll_seconds: float,
    serve_versions: int,
    label_source: LabelSource | None = None,
    access_log: bool = False,
) -> None:
    """Serves until SIGINT/SIGTERM. Raises FileNotFoundError when no complete version exists.

    `grpc_port` 0 serves REST only. `label_source` returns the version labels (label ->
    version); it is asked at start and at every poll, and a failure keeps the labels it gave
    last. `access_log` turns on one log line per request.
    """
    models = VersionedModels(serving_dir, model_name=model_name, serve_versions=serve_versions)

    def current_labels() -> dict[str, int] | None:
        if label_source is None:
            return {}
        try:
            return dict(label_source())
        except Exception as exc:  # noqa: BLE001 - labels are kept as they were; retried next poll
            log.error("reading the version labels failed, keeping %s: %s", models.labels, exc)
            return None

    models.refresh(labels=current_labels())
    newest = models.newest()
    if newest is None:
        raise FileNotFoundError(serving_dir)
    model_server = _import_kserve_model_server()
    from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
    from kserve.protocol.rest.server import RESTServer

    server = model_server.ModelServer(
        http_port=port, enable_grpc=False, workers=1, enable_latency_logging=False
    )
    if not access_log:
        # ModelServer configured KServe's logging just now; these two loggers write per request.
        for name in ("uvicorn.access", "kserve.trace"):
            logging.getLogger(name).setLevel(logging.WARNING)
    executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="tensorflow")
    model = make_kserve_model(model_name, models, executor)
    server.register_model(model)
    dispatch = make_dispatch(server.dataplane, model_name)
    install_tf_serving_routes(
        model_server.app, dispatch=dispatch, models=models, max_request_bytes=max_request_bytes
    )
    rest = RESTServer(
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
                before = dict(models.labels)
                for version in models.refresh(labels=current_labels()):
                    print(
                        f"fullthrottle serve: now serving {model_name} version {version}",
                        file=sys.stderr,
                        flush=True,
                    )
                if models.labels != before:
                    print(
                        f"fullthrottle serve: labels of {model_name} now {models.labels}",
                        file=sys.stderr,
                        flush=True,
                    )
            except Exception as exc:  # noqa: BLE001 - a failed scan is retried at the next poll
                log.error("scanning %s failed: %s", serving_dir, exc)

    async def serve() -> None:
        import grpc

        from serving.grpc_service import add_services

        grpc_server = None
        if grpc_port:
            grpc_server = grpc.aio.server()
            add_services(grpc_server, dispatch=dispatch, models=models)
            if grpc_server.add_insecure_port(f"{host}:{grpc_port}") == 0:
                raise OSError(f"cannot listen for gRPC on {host}:{grpc_port}")
            await grpc_server.start()
        threading.Thread(target=poll, name="version-poller", daemon=True).start()
        print(
            f"fullthrottle serve: serving {model_name} version {newest.version} from "
            f"{serving_dir} at "
            f"{endpoints_text(model_name=model_name, host=host, port=port, grpc_port=grpc_port)}; "
            f"labels {models.labels}",
            file=sys.stderr,
            flush=True,
        )
        try:
            await rest.start()
        finally:
            stop.set()
            if grpc_server is not None:
                await grpc_server.stop(grace=2)
            executor.shutdown(wait=False, cancel_futures=True)

    asyncio.run(serve())
