"""TF Serving's gRPC API: `tensorflow.serving.PredictionService` and `ModelService`.

Built from the `tensorflow-serving-api` protos and stubs, so a TF Serving gRPC client talks to
this server unchanged: Predict, Classify, Regress, MultiInference and GetModelMetadata, and
ModelService.GetModelStatus and HandleReloadConfigRequest, on the same versions and labels as
the REST API, with TF Serving's status codes and messages.

Predict answers carry each output in the typed repeated field of its dtype (`float_val`,
`int64_val`, `string_val`, ...) with its `tensor_shape`, as TF Serving's predictor writes them
(predict_util.cc: `Tensor::AsProtoField`), never in `tensor_content`: TF Serving's own example
clients read `float_val`.

Each call is handed to `dispatch` (the server's path through KServe's data plane, the same one
REST requests take); the work itself runs on the server's TensorFlow thread pool.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np

from serving import servables
from serving.model_config import versions_and_labels
from serving.status import StatusError, invalid_argument

log = logging.getLogger("fullthrottle.serve")
# (method, model name, version, label, work on the resolved version) -> (what the work
# returned, response headers).
Dispatch = Callable[[str, str, int | None, str | None, Callable[[Any], Any]], Awaitable[Any]]
# TF Serving's gRPC server: builder.SetMaxMessageSize(tensorflow::kint32max) (server.cc), for
# requests and answers alike.
DEFAULT_MAX_MESSAGE_BYTES = 2**31 - 1

# numpy dtype kind/size -> the TensorProto field TensorFlow's AsProtoField fills
# (tensorflow/core/framework/tensor.cc, ProtoHelper): int8/int16/int32/uint8/uint16 share
# int_val, float16 and bfloat16 go to half_val as their bit patterns.
_VALUE_FIELDS = {
    np.dtype(np.float32): "float_val",
    np.dtype(np.float64): "double_val",
    np.dtype(np.int32): "int_val",
    np.dtype(np.int16): "int_val",
    np.dtype(np.int8): "int_val",
    np.dtype(np.uint8): "int_val",
    np.dtype(np.uint16): "int_val",
    np.dtype(np.uint32): "uint32_val",
    np.dtype(np.int64): "int64_val",
    np.dtype(np.uint64): "uint64_val",
    np.dtype(np.bool_): "bool_val",
    np.dtype(np.complex64): "scomplex_val",
    np.dtype(np.complex128): "dcomplex_val",
}


def as_proto_field(array: Any, dtype: Any = None) -> Any:
    """A TensorProto of `array` with its values in the typed repeated field, as TensorFlow's
    `Tensor::AsProtoField` writes it (TF Serving's predict answers): dtype, shape, values.

    `dtype` (a tf.DType) overrides the one read from the array: a bfloat16 tensor arrives here
    as numpy's bfloat16 type, which has no field of its own.
    """
    import tensorflow as tf
    from tensorflow.core.framework import tensor_pb2

    values = np.asarray(array)
    tf_dtype = tf.as_dtype(dtype or (tf.string if values.dtype.kind in "OSU" else values.dtype))
    proto = tensor_pb2.TensorProto(dtype=tf_dtype.as_datatype_enum)
    for size in values.shape:
        proto.tensor_shape.dim.add(size=size)
    flat = values.reshape(-1)
    if tf_dtype == tf.string:
        proto.string_val.extend(
            v if isinstance(v, bytes) else str(v).encode("utf-8") for v in flat.tolist()
        )
    elif tf_dtype in (tf.float16, tf.bfloat16):
        proto.half_val.extend(flat.view(np.uint16).astype(np.int32).tolist())
    elif values.dtype in (np.complex64, np.complex128):
        field = getattr(proto, _VALUE_FIELDS[values.dtype])
        field.extend(np.stack([flat.real, flat.imag], axis=-1).reshape(-1).tolist())
    elif values.dtype in _VALUE_FIELDS:
        getattr(proto, _VALUE_FIELDS[values.dtype]).extend(flat.tolist())
    else:
        raise TypeError(f"no TensorProto value field for {values.dtype}")
    return proto


def _type_name(dtype: int) -> str:
    """TensorFlow's DataTypeString ("float", "int64"), as its session's messages write it."""
    from tensorflow.core.framework import types_pb2

    if dtype == types_pb2.DT_INVALID:
        return "invalid"
    return types_pb2.DataType.Name(dtype).removeprefix("DT_").lower()


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


def _require_model_spec(request: Any) -> None:
    """TF Serving's first check on every call that names a model (predict_impl.cc,
    classification_service.cc, regression_service.cc, get_model_metadata_impl.cc,
    get_model_status_impl.cc)."""
    if not request.HasField("model_spec"):
        raise invalid_argument("Missing ModelSpec")


async def _answer(context: grpc.aio.ServicerContext, call: Callable[[], Awaitable[Any]]) -> Any:
    """The response `call` produced, or its failure as the call's status."""
    try:
        response, _headers = await call()
        return response
    except StatusError as exc:
        await context.abort(grpc.StatusCode[exc.code], exc.message)
    except asyncio.CancelledError:
        raise
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
                        f"Expects arg[{key}] to be {_type_name(dtypes[key])} but "
                        f"{_type_name(proto.dtype)} is provided"
                    )
                try:
                    inputs[key] = tf.make_ndarray(proto)
                except (TypeError, ValueError):
                    raise invalid_argument(f"tensor parsing error: {key}") from None
            outputs = servables.predict(loaded, signature_name, inputs, output_filter=output_filter)
            response = predict_pb2.PredictResponse()
            _fill_spec(
                response.model_spec,
                name=name,
                version=loaded.version,
                signature_name=signature_name or servables.DEFAULT_SIGNATURE,
            )
            signature_def, _ = loaded.signature(signature_name)
            for key, array in outputs.items():
                dtype = tf.dtypes.as_dtype(signature_def.outputs[key].dtype)
                response.outputs[key].CopyFrom(as_proto_field(array, dtype))
            return response

        async def call() -> Any:
            _require_model_spec(request)
            return await self._dispatch("predict", name, version, label, work)

        return await _answer(context, call)

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
            _fill_classifications(response.result, rows)
            return response

        async def call() -> Any:
            _require_model_spec(request)
            return await self._dispatch("classify", name, version, label, work)

        return await _answer(context, call)

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
            _fill_regressions(response.result, values)
            return response

        async def call() -> Any:
            _require_model_spec(request)
            return await self._dispatch("regress", name, version, label, work)

        return await _answer(context, call)

    async def MultiInference(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        """TF Serving's MultiInference (multi_inference.cc, multi_inference_helper.cc): the
        servable is the first task's model spec; every task must name the same model."""
        from tensorflow_serving.apis import inference_pb2, model_pb2

        tasks = list(request.tasks)
        first = tasks[0].model_spec if tasks and tasks[0].HasField("model_spec") else None
        name, version, label = _spec(first if first is not None else model_pb2.ModelSpec())

        def work(loaded: servables.LoadedVersion) -> Any:
            for task in tasks:
                if not task.model_spec.name:
                    raise invalid_argument("Found ModelSpec with an empty model name.")
                if task.model_spec.name != name:
                    raise invalid_argument(
                        "All ModelSpecs in a MultiInferenceRequest must access the same model name."
                    )
            results = servables.multi_inference(
                loaded,
                [
                    servables.InferenceTask(t.model_spec.signature_name, t.method_name)
                    for t in tasks
                ],
                _serialized_examples(request.input),
            )
            response = inference_pb2.MultiInferenceResponse()
            for task, result in results:
                answer = response.results.add()
                _fill_spec(
                    answer.model_spec,
                    name=name,
                    version=loaded.version,
                    signature_name=task.signature_name or servables.DEFAULT_SIGNATURE,
                )
                if task.method_name == servables.CLASSIFY_METHOD:
                    _fill_classifications(answer.classification_result, result)
                else:
                    _fill_regressions(answer.regression_result, result)
            return response

        return await _answer(
            context, lambda: self._dispatch("multi_inference", name, version, label, work)
        )

    async def GetModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        name, version, label = _spec(request.model_spec)

        def work(loaded: servables.LoadedVersion) -> Any:
            return servables.metadata(loaded, model_name=name)

        async def call() -> Any:
            # get_model_metadata_impl.cc's checks, in its order.
            _require_model_spec(request)
            fields = list(request.metadata_field)
            if not fields:
                raise invalid_argument(
                    "GetModelMetadataRequest must specify at least one metadata_field"
                )
            for field in fields:
                if field != "signature_def":
                    raise invalid_argument(f"Metadata field {field} is not supported")
            return await self._dispatch("metadata", name, version, label, work)

        return await _answer(context, call)


def _fill_classifications(result: Any, rows: list[list[tuple[str, float]]]) -> None:
    for row in rows:
        classifications = result.classifications.add()
        for class_label, score in row:
            classifications.classes.add(label=class_label, score=score)


def _fill_regressions(result: Any, values: list[float]) -> None:
    for value in values:
        result.regressions.add(value=value)


class ModelService:
    """The servicer of `tensorflow.serving.ModelService` (grpc.aio)."""

    def __init__(self, models: servables.VersionedModels) -> None:
        self._models = models

    async def GetModelStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        async def call() -> Any:
            _require_model_spec(request)
            name, version, _label = _spec(request.model_spec)
            return self._models.status(name, version=version), {}

        return await _answer(context, call)

    async def HandleReloadConfigRequest(  # noqa: N802 - gRPC method name
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        """Applies a new `ModelServerConfig` (its model's version policy and labels) without a
        restart, as TF Serving's model service does (model_service_impl.cc): the versions are
        loaded before the call returns; the answer's `status` is OK, a failure is the call's
        status."""
        from tensorflow_serving.apis import model_management_pb2

        models = self._models

        def apply() -> None:
            policy, labels = versions_and_labels(
                request.config, model_name=models.model_name, serving_dir=models.serving_dir
            )
            models.configure(policy, labels)
            log.info(
                "config reloaded: %s versions %s, labels %s",
                models.model_name,
                sorted(models.versions),
                models.labels,
            )

        async def call() -> Any:
            await asyncio.get_running_loop().run_in_executor(None, apply)
            response = model_management_pb2.ReloadConfigResponse()
            response.status.error_code = 0  # OK
            return response, {}

        return await _answer(context, call)


def add_services(
    server: grpc.aio.Server, *, dispatch: Dispatch, models: servables.VersionedModels
) -> None:
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionService(dispatch), server
    )
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(models), server)


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """gRPC server options: the largest request and answer, as TF Serving sets both."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
