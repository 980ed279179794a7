"""The pushed SavedModel logged as an MLflow 3 model that loads and serves without fullthrottle.

Owns: describing the pushed model for MLflow (the signature of its `predict_raw`: raw feature
columns in, `class` (text), `probability` and `probabilities` out, or a regression model's
`prediction` (a number); the class order; an input
example of real evaluation rows; pinned requirements) and logging it as a models-from-code pyfunc
(`served_model.py`, which imports only MLflow, NumPy, pandas and TensorFlow) with the exact
pushed SavedModel folder as its artifact. MLflow's recommended way for custom models: nothing is
pickled, so loading needs no class of this project. Refuses nothing itself: a model without
`predict_raw` fails in `describe` with the SavedModel's own error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import mlflow
import numpy as np

from fullthrottle.core.features import raw_input_keywords
from fullthrottle.tracking.store import scoped_tracking_uri

CODE = Path(__file__).with_name("served_model.py")
SAVED_MODEL_ARTIFACT = "saved_model"  # served_model.SAVED_MODEL
RAW_SIGNATURE = "predict_raw"
CLASSIFY_SIGNATURE = "classification"
MODEL_NAME = "model"  # the logged model's name in its run
# What the model needs to load and serve, pinned to the versions that logged it. mlflow-skinny:
# MLflow's pyfunc loader and scoring server (FastAPI, uvicorn) without the tracking server's
# database and UI packages.
REQUIREMENTS = ("mlflow-skinny", "tensorflow", "pandas", "numpy")
EXAMPLE_ROWS = 3


@dataclass(frozen=True)
class ServedModelDescription:
    signature: Any  # mlflow.models.ModelSignature
    input_example: Any  # pandas.DataFrame of raw feature rows
    classes: list[str]  # the order of `probabilities` (empty for a regression model)
    numeric_columns: list[str]  # inputs that are numbers (typed "any" in the signature)


def raw_input_specs(loaded: Any) -> dict[str, Any]:
    """`predict_raw`'s inputs (column as written -> TensorSpec): what a client sends, whatever
    keyword the signature function takes for a column whose name is not safe in TensorFlow."""
    specs = dict(loaded.signatures[RAW_SIGNATURE].structured_input_signature[1])
    by_keyword = {keyword: column for column, keyword in raw_input_keywords(loaded).items()}
    return {by_keyword.get(name, name): spec for name, spec in specs.items()}


def _raw_frame(loaded: Any, examples: Sequence[bytes]) -> Any:
    """The first rows of `examples` (serialized tf.Examples) as the DataFrame a client would
    send: one column per `predict_raw` input, numbers as float64 (int64 for an integer
    column), text as str; a missing cell is NaN (numbers) or None (text), as
    ``pandas.read_csv`` gives it."""
    import pandas as pd
    import tensorflow as tf

    specs = raw_input_specs(loaded)
    columns: dict[str, list[Any]] = {name: [] for name in specs}
    for record in examples[:EXAMPLE_ROWS]:
        features = tf.train.Example.FromString(record).features.feature
        for name, spec in specs.items():
            feature = features.get(name)
            kind = feature.WhichOneof("kind") if feature is not None else None
            values = list(getattr(feature, kind).value) if kind else []
            if not values:
                columns[name].append(None if spec.dtype == tf.string else np.nan)
            elif spec.dtype == tf.string:
                value = values[0]
                columns[name].append(value.decode("utf-8") if isinstance(value, bytes) else value)
            else:
                columns[name].append(values[0])
    frame = pd.DataFrame(columns)
    for name, spec in specs.items():
        if spec.dtype.is_floating:
            frame[name] = frame[name].astype(np.float64)
        elif spec.dtype.is_integer:
            frame[name] = frame[name].astype(np.int64)
    return frame


def describe(saved_model_dir: str, examples: Sequence[bytes]) -> ServedModelDescription:
    """The signature, input example and class order of the pushed model in `saved_model_dir`,
    from `examples` (serialized evaluation tf.Examples; the label, if there, is ignored).

    Every input column is optional (`required=False`): a missing column, NaN or None is the
    CSV's empty cell, which the model imputes or refuses itself (a feature its schema
    requires). A numeric column is typed "any": pandas holds 215 as int64 and 215.0 (or any
    column with a missing cell) as float64, and MLflow converts neither int64 nor float64 to
    the other ("Can not safely convert"); the model reads both as numbers and names the column
    of a value that is not one (the columns are listed in the model's metadata under
    `numeric_columns`). An integer column (a category of whole numbers) is "long": MLflow then
    names the column and the type when a value is not a whole number."""
    import tensorflow as tf
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, Schema
    from mlflow.types.schema import AnyType, Array

    loaded = tf.saved_model.load(saved_model_dir)
    specs = raw_input_specs(loaded)
    # A regression model has no classes: its `regression` signature answers numbers.
    regression = CLASSIFY_SIGNATURE not in loaded.signatures
    classes = []
    if not regression:
        classified = loaded.signatures[CLASSIFY_SIGNATURE](inputs=tf.constant(list(examples[:1])))
        classes = [c.decode("utf-8") for c in classified["classes"].numpy()[0]]
    kinds = {tf.string: DataType.string, tf.int64: DataType.long, tf.int32: DataType.integer}
    inputs = Schema(
        [
            ColSpec(
                AnyType() if s.dtype.is_floating else kinds.get(s.dtype, DataType.string),
                name,
                required=False,
            )
            for name, s in sorted(specs.items())
        ]
    )
    outputs = Schema(
        [ColSpec(DataType.double, "prediction")]
        if regression
        else [
            ColSpec(DataType.string, "class"),
            ColSpec(DataType.double, "probability"),
            ColSpec(Array(DataType.double), "probabilities"),
        ]
    )
    return ServedModelDescription(
        signature=ModelSignature(inputs=inputs, outputs=outputs),
        input_example=_raw_frame(loaded, examples),
        classes=classes,
        numeric_columns=sorted(name for name, s in specs.items() if s.dtype.is_floating),
    )


def requirements() -> list[str]:
    return [f"{name}=={version(name)}" for name in REQUIREMENTS]


def log_served_model(
    *,
    uri: str,
    experiment_id: str,
    run_id: str,
    saved_model_dir: str,
    examples: Sequence[bytes],
    tags: dict[str, str],
    model_id: str | None = None,
    link_to_run: bool = True,
) -> Any:
    """Logs the pushed SavedModel as an MLflow logged model `model` of `run_id` (its output),
    into the logged model `model_id` when given (one an interrupted attempt left pending; one it
    already linked to the run is not linked again: `link_to_run` False); returns MLflow's
    ModelInfo (`model_id`, `model_uri` ``models:/<model_id>``)."""
    from mlflow.models import Model
    from mlflow.tracking import MlflowClient

    description = describe(saved_model_dir, examples)
    # Made here, in the run's experiment: left to `Model.log`, the logged model would go into
    # the process's active experiment (fluent state), whatever the run's experiment is.
    if model_id is None:
        model_id = (
            MlflowClient(tracking_uri=uri)
            .create_logged_model(
                experiment_id=experiment_id, name=MODEL_NAME, source_run_id=run_id, tags=tags
            )
            .model_id
        )
    with scoped_tracking_uri(uri):
        return Model.log(
            artifact_path=None,  # positional in MLflow 3.17; `name` replaces it
            name=MODEL_NAME,
            model_id=model_id,
            flavor=mlflow.pyfunc,
            run_id=run_id if link_to_run else None,  # Model.log links the run's output
            python_model=str(CODE),
            artifacts={SAVED_MODEL_ARTIFACT: saved_model_dir},
            signature=description.signature,
            input_example=description.input_example,
            pip_requirements=requirements(),
            metadata={
                "classes": description.classes,
                "signature": RAW_SIGNATURE,
                "numeric_columns": description.numeric_columns,
            },
        )
