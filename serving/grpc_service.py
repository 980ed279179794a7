"""TF Serving's gRPC API: `tensorflow.serving.PredictionService` and `ModelService`.

Built from the `tensorflow-serving-api` protos and stubs, so a TF Serving gRPC client talks to
this server unchanged: Predict, Classify, Regress and GetModelMetadata, and
ModelService.GetModelStatus, on the same versions and labels as the REST API, with TF Serving's
status codes and messages. MultiInference and HandleReloadConfigRequest answer UNIMPLEMENTED
(this server reads no model config to reload; labels come from `fullthrottle serve`).

Each call is handed to `dispatch` (the server's path through KServe's data plane, the same one
REST requests take); the work itself runs on the server's TensorFlow thread pool.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np

from serving import servables
from serving.status import StatusError, invalid_argument

log = logging.getLogger("fullthrottle.serve")
# (method, model name, version, label, work on the resolved version) -> (what the work
# returned, response headers).
Dispatch = Callable[[str, str, int | None, str | None, Callable[[Any], Any]], Awaitable[Any]]


def _spec(model_spec: Any) -> tuple[str, int | None, str | None]:
    choice = model_spec.WhichOneof("version_choice")
    version = model_spec.version.value if choice == "version" else None
    label = model_spec.version_label if choice == "version_label" else None
    return model_spec.name, version, label


def _fill_spec(target: Any, *, name: str, version: int, signature_name: str | None) -> None:
    target.name = name
    target.version.value = version
    if signature_name is not None:
        target.signature_name = signature_name


def _serialized_examples(request_input: Any) -> list[bytes]:
    kind = request_input.WhichOneof("kind")
    if kind == "example_list":
        return [e.SerializeToString() for e in request_input.example_list.examples]
    if kind == "example_list_with_context":
        with_context = request_input.example_list_with_context
        return servables.merge_context(
            with_context.context.SerializeToString(),
            [e.SerializeToString() for e in with_context.examples],
        )
    raise invalid_argument("Input is empty.")


async def _answer(context: grpc.aio.ServicerContext, call: Awaitable[Any]) -> Any:
    """The response `call` produced, or its failure as the call's status."""
    try:
        response, _headers = await call
        return response
    except StatusError as exc:
        await context.abort(grpc.StatusCode[exc.code], exc.message)
    except Exception:
        log.exception("internal error answering a gRPC call")
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the server log")


class PredictionService:
    """The servicer of `tensorflow.serving.PredictionService` (grpc.aio)."""

    def __init__(self, dispatch: Dispatch) -> None:
        self._dispatch = dispatch

    async def Predict(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802 - gRPC method name
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2

        name, version, label = _spec(request.model_spec)
        signature_name = request.model_spec.signature_name
        output_filter = list(request.output_filter)

        def work(loaded: servables.LoadedVersion) -> Any:
            dtypes = servables.input_dtypes(loaded, signature_name)
            inputs = {}
            for key, proto in request.inputs.items():
                if key in dtypes and proto.dtype != dtypes[key]:
                    raise invalid_argument(
                        f"Expects arg[{key}] to be {tf.dtypes.as_dtype(dtypes[key]).name} but "
                        f"{tf.dtypes.as_dtype(proto.dtype).name if proto.dtype else 'invalid'} "
                        "is provided"
                    )
                try:
                    inputs[key] = tf.make_ndarray(proto)
                except (TypeError, ValueError) as exc:
                    raise invalid_argument(f"input {key}: {exc}") from None
            outputs = servables.predict(loaded, signature_name, inputs, output_filter=output_filter)
            response = predict_pb2.PredictResponse()
            _fill_spec(
                response.model_spec,
                name=name,
                version=loaded.version,
                signature_name=signature_name or servables.DEFAULT_SIGNATURE,
            )
            for key, array in outputs.items():
                response.outputs[key].CopyFrom(tf.make_tensor_proto(np.asarray(array)))
            return response

        return await _answer(context, self._dispatch("predict", name, version, label, work))

    async def Classify(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        from tensorflow_serving.apis import classification_pb2

        name, version, label = _spec(request.model_spec)
        signature_name = request.model_spec.signature_name

        def work(loaded: servables.LoadedVersion) -> Any:
            rows = servables.classify(loaded, signature_name, _serialized_examples(request.input))
            response = classification_pb2.ClassificationResponse()
            _fill_spec(
                response.model_spec,
                name=name,
                version=loaded.version,
                signature_name=signature_name or servables.DEFAULT_SIGNATURE,
            )
            for row in rows:
                classifications = response.result.classifications.add()
                for class_label, score in row:
                    classifications.classes.add(label=class_label, score=score)
            return response

        return await _answer(context, self._dispatch("classify", name, version, label, work))

    async def Regress(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        from tensorflow_serving.apis import regression_pb2

        name, version, label = _spec(request.model_spec)
        signature_name = request.model_spec.signature_name

        def work(loaded: servables.LoadedVersion) -> Any:
            values = servables.regress(loaded, signature_name, _serialized_examples(request.input))
            response = regression_pb2.RegressionResponse()
            _fill_spec(
                response.model_spec,
                name=name,
                version=loaded.version,
                signature_name=signature_name or servables.DEFAULT_SIGNATURE,
            )
            for value in values:
                response.result.regressions.add(value=value)
            return response

        return await _answer(context, self._dispatch("regress", name, version, label, work))

    async def GetModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        if not request.HasField("model_spec"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
        fields = list(request.metadata_field)
        if not fields:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "GetModelMetadataRequest must specify at least one metadata_field",
            )
        for field in fields:
            if field != "signature_def":
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"Metadata field {field} is not supported"
                )
        name, version, label = _spec(request.model_spec)

        def work(loaded: servables.LoadedVersion) -> Any:
            return servables.metadata(loaded, model_name=name)

        return await _answer(context, self._dispatch("metadata", name, version, label, work))

    async def MultiInference(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "MultiInference is not served by fullthrottle serve; call Classify or Regress",
        )


class ModelService:
    """The servicer of `tensorflow.serving.ModelService` (grpc.aio)."""

    def __init__(self, models: servables.VersionedModels) -> None:
        self._models = models

    async def GetModelStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        if not request.HasField("model_spec"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
        name, version, label = _spec(request.model_spec)
        try:
            return self._models.status(name, version=version, label=label)
        except StatusError as exc:
            await context.abort(grpc.StatusCode[exc.code], exc.message)

    async def HandleReloadConfigRequest(  # noqa: N802 - gRPC method name
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "fullthrottle serve reads no model config; labels come from serving.version_labels "
            "and the MLflow alias",
        )


def add_services(
    server: grpc.aio.Server, *, dispatch: Dispatch, models: servables.VersionedModels
) -> None:
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionService(dispatch), server
    )
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(models), server)
