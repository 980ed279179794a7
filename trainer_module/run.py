"""The Trainer component's `run_fn`: a thin adapter from TFX's `fn_args` to `train()`.

It rebuilds the validated config from `custom_config`, describes Transform's output to the model
(`ModelInputs`), calls the training library, and, on the chief only, exports the serving model
with the Transform graph attached and writes a JSON summary of the run next to the TensorBoard
logs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from typing import Any

import tensorflow as tf
import tensorflow_transform as tft

from fullthrottle.core.features import LABEL_VOCAB, NUM_OOV_BUCKETS, transformed_name, vocab_name
from fullthrottle.progress import TrainerProgress
from fullthrottle.tracking import LINK_KEY, trainer_hooks, trainer_tracking_status
from serving.signatures import export_serving_model
from trainer_module.training import SUMMARY_FILE, ModelInputs, TrainingConfig, train


def model_inputs_from(
    spec: Any, tft_output: tft.TFTransformOutput, train_files: list[str] | None = None
) -> ModelInputs:
    """Describes Transform's output (names, cardinalities, sequence lengths) for the model; for
    a regression label also the training labels' mean and standard deviation (read from
    `train_files`, the transformed training split), which scale the model's output."""
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
    label = transformed_name(spec.label)
    if spec.task == "regression":
        mean, std = label_statistics(train_files or [], label)
        task: dict[str, Any] = {
            "task": "regression",
            "num_classes": 1,
            "label_mean": mean,
            "label_std": std,
        }
    else:
        task = {"num_classes": tft_output.vocabulary_size_by_name(LABEL_VOCAB)}
    return ModelInputs(
        numeric=tuple(transformed_name(c) for c in spec.numeric),
        categorical=categorical,
        text=text,
        label=label,
        **task,
    )


def label_statistics(files: list[str], label: str) -> tuple[float, float]:
    """Mean and standard deviation of the float32 `label` over gzip TFRecords of transformed
    examples (one pass that parses the label alone); (0, 1) without files, std 1 for a
    constant label."""
    if not files:
        return 0.0, 1.0
    dataset = (
        tf.data.TFRecordDataset(files, compression_type="GZIP")
        .batch(4096)
        .map(
            lambda records: tf.io.parse_example(
                records, {label: tf.io.FixedLenFeature([], tf.float32)}
            )[label]
        )
    )
    count, total, squares = 0.0, 0.0, 0.0
    for values in dataset.as_numpy_iterator():
        values = values.astype("float64")
        count += values.size
        total += float(values.sum())
        squares += float((values * values).sum())
    if not count:
        return 0.0, 1.0
    mean = total / count
    variance = max(squares / count - mean * mean, 0.0)
    return mean, (variance**0.5 if variance > 0 else 1.0)


def _expand(patterns: list[str]) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        matched = sorted(tf.io.gfile.glob(pattern))
        files.extend(matched if matched else [pattern])
    return files


def run_fn(fn_args: Any) -> None:
    """Called by TFX's Trainer (GenericExecutor)."""
    from fullthrottle.core.config import data_spec_from_custom_config, validate_section

    custom = fn_args.custom_config or {}
    spec = data_spec_from_custom_config(custom)
    # Step counts come from TFX's train/eval args, everything else from custom_config.
    training = validate_section(
        TrainingConfig,
        {
            **custom.get("training", {}),
            "train_steps": int(fn_args.train_steps),
            "eval_steps": int(fn_args.eval_steps) if fn_args.eval_steps else None,
        },
        where="training",
    )

    tft_output = tft.TFTransformOutput(fn_args.transform_output)
    train_files = _expand(list(fn_args.train_files))
    eval_files = _expand(list(fn_args.eval_files))
    model_inputs = model_inputs_from(spec, tft_output, train_files)
    feature_spec = tft_output.transformed_feature_spec()

    work_dir = stable_work_dir(
        fn_args,
        key_material={
            "train_files": train_files,
            "transform_output": fn_args.transform_output,
            "training": custom.get("training", {}),
            "train_steps": training.train_steps,
            "code": custom.get("code_fingerprint"),
        },
    )
    # MLflow: a hook when the pipeline carries a tracking link (chief only). Its params, for a
    # pipeline run the hook has to make itself (Kubeflow), are this Trainer's config.
    tracking_hooks = trainer_hooks(
        custom.get(LINK_KEY),
        run_params={"data": custom.get("data", {}), "training": dataclasses.asdict(training)},
    )
    result = train(
        config=training,
        model_inputs=model_inputs,
        feature_spec=feature_spec,
        train_files=train_files,
        eval_files=eval_files,
        work_dir=work_dir,
        hooks=[TrainerProgress(), *tracking_hooks],
    )
    if not result.is_chief:
        return
    export_serving_model(
        result.serving_model,
        tft_output=tft_output,
        label=spec.label,
        export_dir=fn_args.serving_model_dir,
        features=spec.feature_columns,
        numeric=spec.numeric,
        task=spec.task,
    )
    # TensorBoard logs (and a profile, if captured) belong to this execution's model_run artifact.
    for name in ("logs", "profile"):
        source = os.path.join(work_dir, name)
        if tf.io.gfile.isdir(source):
            _copy_tree(source, os.path.join(fn_args.model_run_dir, name))
    summary = result.summary()
    # The step-time advisor: input wait vs compute, and what to change.
    from trainer_module.training.advisor import advise_result, format_advice

    summary["advisor"] = advise_result(result, training)
    summary["tracking"] = trainer_tracking_status(tracking_hooks)
    logging.info(
        "fullthrottle step-time advisor:\n%s", "\n".join(format_advice(summary["advisor"]))
    )
    tf.io.gfile.makedirs(fn_args.model_run_dir)
    with tf.io.gfile.GFile(os.path.join(fn_args.model_run_dir, SUMMARY_FILE), "w") as f:
        f.write(json.dumps(summary, indent=2, default=float))
    # The model is exported: its checkpoints have done their job. Removing them means a later
    # run with the same inputs (cache disabled) trains afresh instead of "resuming" at the end.
    tf.io.gfile.rmtree(work_dir)


def stable_work_dir(fn_args: Any, *, key_material: dict[str, Any]) -> str:
    """A checkpoint folder that survives a killed pipeline run.

    TFX gives every Trainer execution a new `model_run_dir`, so a rerun after a crash would not
    find the killed execution's checkpoints there. This folder is keyed by what determines the
    training (input files, transform graph, training config, code), so the rerun of the same
    training resumes from its last checkpoint, and a different training never does.
    """
    key = hashlib.sha256(
        json.dumps(key_material, sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    # model_run_dir = <pipeline_root>/Trainer/model_run/<execution id>. Not normpath: it would
    # turn "gs://bucket" into the local path "gs:/bucket".
    trainer_root = os.path.dirname(os.path.dirname(str(fn_args.model_run_dir).rstrip("/")))
    return os.path.join(trainer_root, "training_state", key)


def _copy_tree(source: str, target: str) -> None:
    for directory, _, files in tf.io.gfile.walk(source):
        relative = os.path.relpath(directory, source)
        destination = target if relative == "." else os.path.join(target, relative)
        tf.io.gfile.makedirs(destination)
        for name in files:
            tf.io.gfile.copy(
                os.path.join(directory, name), os.path.join(destination, name), overwrite=True
            )
