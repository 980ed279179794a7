"""The pushed SavedModel as an MLflow model (pyfunc flavor) with its signature.

Owns: wrapping the exact pushed SavedModel folder (not a re-export) so that
`mlflow.pyfunc.load_model(uri).predict(dataframe_of_raw_features)` answers through the model's
`predict_raw` signature, and describing that signature for MLflow (raw feature columns in,
`probabilities` [N, C] float32 and `classes` string out). Refuses nothing itself: a model
without `predict_raw` fails in `describe_signature` with the SavedModel's own error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np

SAVED_MODEL_ARTIFACT = "saved_model"
RAW_SIGNATURE = "predict_raw"


class PushedServingModel(mlflow.pyfunc.PythonModel):
    """pyfunc adapter: DataFrame (or dict) of raw features -> dict of numpy outputs."""

    def load_context(self, context: Any) -> None:
        import tensorflow as tf

        self._model = tf.saved_model.load(context.artifacts[SAVED_MODEL_ARTIFACT])
        self._fn = self._model.signatures[RAW_SIGNATURE]
        self._specs = self._fn.structured_input_signature[1]

    def predict(
        self, context: Any, model_input: Any, params: dict[str, Any] | None = None
    ) -> dict[str, np.ndarray]:
        import tensorflow as tf

        columns = (
            model_input
            if isinstance(model_input, dict)
            else {c: model_input[c].to_numpy() for c in model_input.columns}
        )
        features = {
            name: tf.constant(
                np.asarray(columns[name]).astype(
                    spec.dtype.as_numpy_dtype if spec.dtype != tf.string else object
                ),
                spec.dtype,
            )
            for name, spec in self._specs.items()
        }
        outputs = self._fn(**features)
        return {name: value.numpy() for name, value in outputs.items()}


def describe_signature(saved_model_dir: str) -> Any:
    """The MLflow `ModelSignature` of a pushed model's `predict_raw`."""
    import tensorflow as tf
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema, TensorSpec

    loaded = tf.saved_model.load(saved_model_dir)
    fn = loaded.signatures[RAW_SIGNATURE]
    # float32 inputs are declared "double": pandas reads decimals as float64, and MLflow refuses
    # float64 -> float32 as unsafe. The wrapper casts to the SavedModel's float32 itself.
    kinds = {
        tf.string: "string",
        tf.float32: "double",
        tf.float64: "double",
        tf.int64: "long",
        tf.int32: "integer",
    }
    inputs = Schema(
        [
            ColSpec(kinds.get(spec.dtype, "string"), name)
            for name, spec in sorted(fn.structured_input_signature[1].items())
        ]
    )
    outputs = []
    for name, spec in sorted(fn.structured_outputs.items()):
        dtype = np.dtype(object) if spec.dtype == tf.string else np.dtype(spec.dtype.as_numpy_dtype)
        shape = tuple(-1 if d is None else int(d) for d in spec.shape.as_list())
        outputs.append(TensorSpec(dtype, shape, name))
    return ModelSignature(inputs=inputs, outputs=Schema(outputs))


def save_pyfunc(saved_model_dir: str, target: Path) -> None:
    """Writes the MLflow model folder (MLmodel, the SavedModel as an artifact) to `target`."""
    import tensorflow as tf

    mlflow.pyfunc.save_model(
        path=str(target),
        python_model=PushedServingModel(),
        artifacts={SAVED_MODEL_ARTIFACT: saved_model_dir},
        signature=describe_signature(saved_model_dir),
        # Listed, not inferred: inference loads the model in a subprocess (slow, and it needs
        # the network to check packages).
        pip_requirements=[f"tensorflow=={tf.__version__}", f"mlflow=={mlflow.__version__}"],
    )
