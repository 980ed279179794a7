"""The pushed SavedModel as an MLflow pyfunc model: MLflow's models-from-code file.

MLflow copies this file into every logged model and runs it when the model is loaded
(`mlflow.pyfunc.load_model`, `mlflow models serve`), so it imports nothing but MLflow, NumPy,
pandas and TensorFlow: the model loads and serves where fullthrottle is not installed. It is
never imported by fullthrottle itself (`fullthrottle.tracking.mlflow_model` logs it by path).

The model answers through the SavedModel's `predict_raw` signature (one tensor per raw feature;
the Transform graph is inside the SavedModel): a DataFrame of raw feature columns in, one row per
example out with the predicted `class` (text), its `probability`, and `probabilities` in the
order of the `classes` the model config lists.
"""

import mlflow
import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

SAVED_MODEL = "saved_model"  # the artifact holding the pushed SavedModel folder
SIGNATURE = "predict_raw"


class PushedModel(PythonModel):
    def load_context(self, context):
        import tensorflow as tf

        self._model = tf.saved_model.load(context.artifacts[SAVED_MODEL])
        self._predict = self._model.signatures[SIGNATURE]
        # Columns whose names are not safe inside TensorFlow are taken by the signature function
        # under an internal keyword; the model's `raw_input_names` table maps them (the same
        # reading as fullthrottle.core.features.raw_input_keywords, repeated: this file imports
        # nothing of fullthrottle).
        self._keywords = {}
        names = getattr(self._model, "raw_input_names", None)
        if names is not None:
            table = names()
            columns = [c.decode("utf-8") for c in table["column"].numpy()]
            internal = [c.decode("utf-8") for c in table["internal"].numpy()]
            self._keywords = dict(zip(columns, internal, strict=True))
        by_keyword = {keyword: column for column, keyword in self._keywords.items()}
        specs = self._predict.structured_input_signature[1]
        self._inputs = {by_keyword.get(name, name): spec for name, spec in specs.items()}

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        import tensorflow as tf

        features = {}
        for name, spec in self._inputs.items():
            column = model_input[name].to_numpy()
            if spec.dtype == tf.string:
                values = np.array([str(v) for v in column], dtype=object)
            else:
                values = column.astype(spec.dtype.as_numpy_dtype)
            features[self._keywords.get(name, name)] = tf.constant(values, dtype=spec.dtype)
        outputs = self._predict(**features)
        probabilities = outputs["probabilities"].numpy().astype(np.float64)
        return pd.DataFrame(
            {
                # The SavedModel names its classes as bytes (a tf.string tensor): text here.
                "class": [c.decode("utf-8") for c in outputs["classes"].numpy()],
                "probability": probabilities.max(axis=1),
                "probabilities": list(probabilities),
            }
        )


mlflow.models.set_model(PushedModel())
