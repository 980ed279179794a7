"""The pushed SavedModel as an MLflow pyfunc model: MLflow's models-from-code file.

MLflow copies this file into every logged model and runs it when the model is loaded
(`mlflow.pyfunc.load_model`, `mlflow models serve`), so it imports nothing but MLflow, NumPy,
pandas and TensorFlow: the model loads and serves where fullthrottle is not installed. It is
never imported by fullthrottle itself (`fullthrottle.tracking.mlflow_model` logs it by path).

The model answers through the SavedModel's `predict_raw` signature (one tensor per raw feature;
the Transform graph is inside the SavedModel): a DataFrame of raw feature columns in, one row per
example out with the predicted `class` (text), its `probability`, and `probabilities` in the
order of the `classes` the model config lists; for a regression model, its `prediction` (a
number).

A missing value is the CSV's empty cell, however pandas holds it: NaN or None in a cell, or a
column left out. It reaches the model as NaN (numbers) or "" (text), which the SavedModel reads
as absent: it imputes it, or refuses a feature its schema requires, naming it. Numbers are
numbers: whole or not, int64 or float64 columns alike (``pd.read_csv`` reads a column with a
missing cell as float64).
"""

import re

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

        rows = len(model_input)
        features = {}
        for name, spec in self._inputs.items():
            if name in model_input:
                column = model_input[name]
            else:  # an optional column left out: every cell of it is missing
                column = pd.Series([None] * rows, index=model_input.index, dtype=object)
            missing = column.isna().to_numpy()
            if spec.dtype == tf.string:
                values = np.array(
                    ["" if gone else str(v) for v, gone in zip(column, missing, strict=True)],
                    dtype=object,
                )
            elif spec.dtype.is_floating:
                numbers = pd.to_numeric(column, errors="coerce")
                bad = column[numbers.isna().to_numpy() & ~missing]
                if len(bad):
                    raise ValueError(
                        f"column {name!r} holds numbers (whole or not), but row "
                        f"{bad.index[0]} has {bad.iloc[0]!r}: send a number, or NaN or None "
                        "where the value is missing"
                    )
                values = numbers.to_numpy(dtype=np.float64).astype(np.float32)
            else:
                if missing.any():
                    raise ValueError(
                        f"column {name!r} holds whole numbers the model needs (int64) and "
                        "cannot be missing here; fill it, or send the row as a tf.Example"
                    )
                values = column.to_numpy().astype(spec.dtype.as_numpy_dtype)
            features[self._keywords.get(name, name)] = tf.constant(values, dtype=spec.dtype)
        try:
            outputs = self._predict(**features)
        except tf.errors.InvalidArgumentError as exc:
            # The SavedModel's own refusal (a feature its schema requires is missing), without
            # TensorFlow's graph-node wrapping.
            found = re.search(r"assertion failed: \[(.*?)\]", exc.message)
            text = found.group(1) if found else exc.message.strip().splitlines()[-1]
            raise ValueError(text) from None
        if "predictions" in outputs:  # a regression model: one number per example
            return pd.DataFrame({"prediction": outputs["predictions"].numpy().astype(np.float64)})
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
