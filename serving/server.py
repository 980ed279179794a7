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
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from fastapi import Request
from fastapi.responses import Response
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving import rest_protocol, servables
from serving.grpc_service import DEFAULT_MAX_MESSAGE_BYTES
from serving.servables import LabelSource, VersionedModels, VersionPolicy
from serving.status import StatusError, invalid_argument

log = logging.getLogger("fullthrottle.serve")
VERSION_HEADER = "x-fullthrottle-model-version"

# TF Serving's REST paths (http_rest_api_util.cc), case-insensitive as there. The method and
# the "metadata" word are then compared case-sensitively (http_rest_api_handler.cc):
# ":PREDICT" is a malformed request, ".../METADATA" asks for the model's status.
_PREDICT_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)",
    re.IGNORECASE,
)
_STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?",
    re.IGNORECASE,
)
_METHODS = ("classify", "regress", "predict")
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


class _V1Prefix(Convertor):
    """TF Serving's handler takes every path matching "(?i)/v1/.*": /V1/ included."""

    regex = "[vV]1"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


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
            raise invalid_argument(f"Failed to convert version: {text} to numeric.")
        return number

    def decoded(text: str | None) -> str | None:
        # TF Serving matches the path as sent, then percent-decodes the name and the label.
        return None if text is None else unquote(text)

    async def post(path: str, request: Request) -> Response:
        match = _PREDICT_PATH.fullmatch(path)
        if not match or match.group(4) not in _METHODS:
            raise invalid_argument(f"Malformed request: POST {path}")
        name_text, version_text, label_text, method = match.groups()
        name, label = decoded(name_text), decoded(label_text)
        version = parse_version(version_text)
        body = await request.body()

        def work(loaded: servables.LoadedVersion) -> bytes:
            document = rest_protocol.parse_body(body)
            if method == "predict":
                signature = rest_protocol.signature_name(document)
                dtypes = servables.input_dtypes(loaded, signature, rest=True)
                decoded_request = rest_protocol.predict_inputs(document, dtypes)
                outputs = servables.predict(loaded, signature, decoded_request.inputs)
                answer = rest_protocol.predict_response(
                    outputs, row_format=decoded_request.row_format
                )
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
        name_text, version_text, label_text, subresource = match.groups()
        name, label = decoded(name_text), decoded(label_text)
        if not name:
            raise invalid_argument("Missing model name in request.")
        version = parse_version(version_text)
        if subresource == "metadata":
            loaded = models.resolve(name, version=version, label=label)
            body = metadata_json(servables.metadata(loaded, model_name=name))
        else:
            # GetModelStatus reads the version only: a label lists every version.
            body = status_json(models.status(name, version=version))
        return _json_response(200, body)

    async def v1(request: Request) -> Response:
        # The path as sent (percent-encoding kept), as TF Serving's handler matches it.
        path = request.scope.get("raw_path", b"").decode("latin-1") or request.url.path
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
    register_url_convertor("tf_serving_v1", _V1Prefix())
    app.add_api_route(
        "/{prefix:tf_serving_v1}/{rest:tf_serving_path}",
        v1,
        methods=["GET", "POST", "PUT", "DELETE", "PATCH"],
        response_model=None,
        include_in_schema=False,
    )
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes)


def metadata_json(response: Any) -> dict[str, Any]:
    """GetModelMetadataResponse as TF Serving's REST API writes it (http_rest_api_util.cc
    ToJsonString): the model spec and the SignatureDefMap unpacked from its `Any`, each printed
    with proto field names and every field, so ``metadata.signature_def`` parses back with
    ``json_format.ParseDict(..., SignatureDefMap())``."""
    from google.protobuf import json_format
    from tensorflow_serving.apis import get_model_metadata_pb2

    def printed(message: Any) -> dict[str, Any]:
        return json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )

    signature_map = get_model_metadata_pb2.SignatureDefMap()
    response.metadata[servables.SIGNATURE_DEF_FIELD].Unpack(signature_map)
    return {
        "model_spec": printed(response.model_spec),
        "metadata": {servables.SIGNATURE_DEF_FIELD: printed(signature_map)},
    }


def status_json(response: Any) -> dict[str, Any]:
    """GetModelStatusResponse as TF Serving's REST API writes it (every field printed; the
    proto's json_name keeps snake_case; enums by name)."""
    from google.protobuf import json_format

    return json_format.MessageToDict(response, always_print_fields_with_no_presence=True)


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
    version_labels: Mapping[str, int] | None = None,
    label_source: LabelSource | None = None,
    grpc_max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    access_log: bool = False,
) -> None:
    """Serves until SIGINT/SIGTERM. Raises FileNotFoundError when no complete version exists.

    `grpc_port` 0 serves REST only. `version_labels` are the configured labels (label ->
    version; a gRPC HandleReloadConfigRequest replaces them). `label_source` returns more
    labels (the MLflow alias); it is asked at start and at every poll, a failure keeps the
    labels it gave last, and a configured label of the same name wins. `grpc_max_message_bytes`
    bounds gRPC requests and answers (TF Serving's 2 GiB - 1 by default). `access_log` turns on
    one log line per request.
    """
    models = VersionedModels(
        serving_dir,
        model_name=model_name,
        policy=VersionPolicy("latest", num_versions=serve_versions),
        labels=version_labels,
    )

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

        from serving.grpc_service import add_services, server_options

        grpc_server = None
        if grpc_port:
            grpc_server = grpc.aio.server(options=server_options(grpc_max_message_bytes))
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
