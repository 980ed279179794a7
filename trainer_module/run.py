"""The Trainer component's `run_fn`: a thin adapter from TFX's `fn_args` to `train()`.

It rebuilds the validated config from `custom_config`, describes Transform's output to the model
(`ModelInputs`), calls the training library, and, on the chief only, exports the serving model
with the Transform graph attached and writes a JSON summary of the run next to the TensorBoard
logs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

import tensorflow as tf
import tensorflow_transform as tft

from serving.signatures import export_serving_model
from trainer_module.features import LABEL_VOCAB, NUM_OOV_BUCKETS, transformed_name, vocab_name
from trainer_module.training import ModelInputs, TrainingConfig, TrainingHook, train

SUMMARY_FILE = "training_summary.json"


def model_inputs_from(spec: Any, tft_output: tft.TFTransformOutput) -> ModelInputs:
    """Describes Transform's output (names, cardinalities, sequence lengths) for the model."""
    categorical = {
        transformed_name(c): tft_output.vocabulary_size_by_name(vocab_name(c)) + NUM_OOV_BUCKETS
        for c in spec.categorical
    }
    # Text ids: 0 padding, then the vocabulary, then the OOV bucket.
    text = {
        transformed_name(t.name): (
            tft_output.vocabulary_size_by_name(vocab_name(t.name)) + NUM_OOV_BUCKETS + 1,
            t.max_tokens,
        )
        for t in spec.text
    }
    return ModelInputs(
        numeric=tuple(transformed_name(c) for c in spec.numeric),
        categorical=categorical,
        text=text,
        label=transformed_name(spec.label),
        num_classes=tft_output.vocabulary_size_by_name(LABEL_VOCAB),
    )


class ProgressLines(TrainingHook):
    """Plain periodic progress lines (no control characters), for logs and CI."""

    def __init__(self, stream: Any = None) -> None:
        self._stream = stream or sys.stderr
        self._total = 0

    def on_train_begin(self, info: dict) -> None:
        self._total = int(info.get("train_steps", 0))
        start = info.get("initial_step", 0)
        self._stream.write(
            f"[trainer] start step={start}/{self._total} strategy={info.get('strategy_name')} "
            f"replicas={info.get('num_replicas')} global_batch={info.get('global_batch_size')} "
            f"precision={info.get('precision_policy')}\n"
        )
        self._stream.flush()

    def on_loop_end(self, step: int, metrics: dict) -> None:
        parts = [f"[trainer] step {step}/{self._total}"]
        for key in ("loss", "examples_per_second", "input_wait_fraction", "learning_rate"):
            if key in metrics and metrics[key] is not None:
                parts.append(f"{key}={float(metrics[key]):.4g}")
        self._stream.write(" ".join(parts) + "\n")
        self._stream.flush()


def _expand(patterns: list[str]) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        matched = sorted(tf.io.gfile.glob(pattern))
        files.extend(matched if matched else [pattern])
    return files


def run_fn(fn_args: Any) -> None:
    """Called by TFX's Trainer (GenericExecutor)."""
    from fullthrottle.config import build_dataclass
    from trainer_module.features import data_spec_from_custom_config

    custom = fn_args.custom_config or {}
    spec = data_spec_from_custom_config(custom)
    training = build_dataclass(TrainingConfig, custom.get("training", {}), "training")
    if fn_args.train_steps:
        training = dataclasses.replace(training, train_steps=int(fn_args.train_steps))

    tft_output = tft.TFTransformOutput(fn_args.transform_output)
    model_inputs = model_inputs_from(spec, tft_output)
    feature_spec = tft_output.transformed_feature_spec()

    result = train(
        config=training,
        model_inputs=model_inputs,
        feature_spec=feature_spec,
        train_files=_expand(list(fn_args.train_files)),
        eval_files=_expand(list(fn_args.eval_files)),
        work_dir=fn_args.model_run_dir,
        hooks=[ProgressLines()],
    )
    if not result.is_chief:
        return
    export_serving_model(
        result.serving_model,
        tft_output=tft_output,
        label=spec.label,
        export_dir=fn_args.serving_model_dir,
    )
    summary = summarize(result)
    os.makedirs(fn_args.model_run_dir, exist_ok=True)
    with open(os.path.join(fn_args.model_run_dir, SUMMARY_FILE), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, default=float)


def summarize(result: Any) -> dict[str, Any]:
    """The JSON-safe part of a `TrainResult` (everything but the model)."""
    summary = {}
    for field in dataclasses.fields(result):
        if field.name == "serving_model":
            continue
        summary[field.name] = getattr(result, field.name)
    return json.loads(json.dumps(summary, default=_json_default))


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
