"""SafePusher: the pipeline's Pusher, publishing blessed models as complete version folders.

Spec / executor / component, as in TFX's hello_world example: `Executor.Do` only unpacks the
artifacts and calls `serving.push.push_model`, which is tested on its own. The pipeline gives it
the node id ``Pusher`` and reads the ``pushed_model`` artifact's custom properties ``pushed``
(1/0), ``pushed_destination`` and ``pushed_version``, like the stock Pusher's.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, override

import tensorflow as tf
from tfx.dsl.components.base import base_component, base_executor, executor_spec
from tfx.types import artifact_utils, channel, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter
from tfx.utils import path_utils

from serving.push import TFLITE_DIR, WARMUP_RELATIVE_PATH, push_model, version_dirs

# Evaluation examples read for warmup requests: enough for 1000 records at batch sizes <= 8.
_MAX_WARMUP_EXAMPLES = 256


class SafePusherSpec(ComponentSpec):
    PARAMETERS = {
        "serving_dir": ExecutionParameter(type=str),
        "model_name": ExecutionParameter(type=str),
        "label": ExecutionParameter(type=str),
        # JSON of the push-related `serving` fields only: a changed port must not re-push.
        "push_config": ExecutionParameter(type=str),
    }
    INPUTS = {
        "model": ChannelParameter(type=standard_artifacts.Model),
        "model_blessing": ChannelParameter(type=standard_artifacts.ModelBlessing, optional=True),
        "examples": ChannelParameter(type=standard_artifacts.Examples, optional=True),
    }
    OUTPUTS = {"pushed_model": ChannelParameter(type=standard_artifacts.PushedModel)}


PUSH_FIELDS = ("warmup_requests", "keep_versions", "tflite", "tflite_quantize")


def _eval_examples(examples_artifacts: list[Any], *, label: str, limit: int) -> list[bytes]:
    """Serialized eval-split tf.Examples with the label removed (what a client sends)."""
    if not examples_artifacts:
        return []
    split_uri = artifact_utils.get_split_uri(examples_artifacts, "eval")
    files = sorted(tf.io.gfile.glob(os.path.join(split_uri, "*")))
    records: list[bytes] = []
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP").take(limit):
        example = tf.train.Example.FromString(record.numpy())
        if label in example.features.feature:
            del example.features.feature[label]
        records.append(example.SerializeToString())
    return records


# A push killed after publishing is not published twice.
def already_published(
    serving_dir: str, *, model_dir: str, warmup_records: int, tflite: bool
) -> tuple[int, str] | None:
    """The newest version, if it already holds this SavedModel as this push would write it.

    A run killed after the version folder was renamed into place but before TFX recorded the
    Pusher's execution re-executes the Pusher when rerun; without this check it would publish
    the same model again under a newer version. Same model means byte-identical
    ``fingerprint.pb`` (TF's hashes of the graph, signatures and checkpoint); the warmup record
    count and the TFLite folder must match too, so a changed `serving` push setting still pushes.
    Returns None (push) when there is no version or any of these differ or cannot be read.
    """
    versions = version_dirs(serving_dir)
    if not versions:
        return None
    version = max(versions)
    published = versions[version]
    fingerprints = [os.path.join(d, "fingerprint.pb") for d in (model_dir, published)]
    if not all(tf.io.gfile.exists(path) for path in fingerprints):
        return None
    source, target = (_read_bytes(path) for path in fingerprints)
    if source != target:
        return None
    warmup_path = os.path.join(published, WARMUP_RELATIVE_PATH)
    found = 0
    if tf.io.gfile.exists(warmup_path):
        found = sum(1 for _ in tf.data.TFRecordDataset(warmup_path))
    if found != warmup_records or tf.io.gfile.isdir(os.path.join(published, TFLITE_DIR)) != tflite:
        return None
    return version, published


def _read_bytes(path: str) -> bytes:
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


class Executor(base_executor.BaseExecutor):
    @override
    def Do(
        self,
        input_dict: dict[str, list[Any]],
        output_dict: dict[str, list[Any]],
        exec_properties: dict[str, Any],
    ) -> None:
        pushed = artifact_utils.get_single_instance(output_dict["pushed_model"])
        blessings = input_dict.get("model_blessing") or []
        # The Cond around this component already checks the blessing; checking again here means
        # the component is safe when wired without it too.
        if blessings and not all(b.get_int_custom_property("blessed") == 1 for b in blessings):
            pushed.set_int_custom_property("pushed", 0)
            return
        push_config = json.loads(exec_properties["push_config"])
        model = artifact_utils.get_single_instance(input_dict["model"])
        examples = _eval_examples(
            input_dict.get("examples") or [],
            label=exec_properties["label"],
            limit=_MAX_WARMUP_EXAMPLES,
        )
        model_dir = path_utils.serving_model_path(model.uri)
        # A rerun after a kill between publish and TFX's record reuses the version.
        expected_warmup = int(push_config["warmup_requests"]) if examples else 0
        existing = already_published(
            exec_properties["serving_dir"],
            model_dir=model_dir,
            warmup_records=expected_warmup,
            tflite=bool(push_config["tflite"]),
        )
        if existing is not None:
            version, version_dir = existing
            logging.info("version %s already holds this model: not pushed again", version)
            pushed.set_int_custom_property("pushed", 1)
            pushed.set_string_custom_property("pushed_destination", version_dir)
            pushed.set_string_custom_property("pushed_version", str(version))
            pushed.set_int_custom_property("warmup_records", expected_warmup)
            return
        result = push_model(
            model_dir=model_dir,
            serving_dir=exec_properties["serving_dir"],
            model_name=exec_properties["model_name"],
            warmup_examples=examples,
            warmup_count=int(push_config["warmup_requests"]),
            keep_versions=int(push_config["keep_versions"]),
            tflite=bool(push_config["tflite"]),
            tflite_quantize=bool(push_config["tflite_quantize"]),
        )
        pushed.set_int_custom_property("pushed", 1)
        pushed.set_string_custom_property("pushed_destination", result.version_dir)
        pushed.set_string_custom_property("pushed_version", str(result.version))
        pushed.set_int_custom_property("warmup_records", result.warmup_records)


class SafePusher(base_component.BaseComponent):
    """Pushes a blessed model to `serving_dir/<version>/` with warmup records; see module doc."""

    SPEC_CLASS = SafePusherSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(Executor)

    def __init__(
        self,
        *,
        model: Any,
        serving_dir: str,
        model_name: str,
        label: str,
        serving: Any,
        model_blessing: Any | None = None,
        examples: Any | None = None,
    ) -> None:
        push_config = json.dumps(
            {name: getattr(serving, name) for name in PUSH_FIELDS}, sort_keys=True
        )
        super().__init__(
            spec=SafePusherSpec(
                model=model,
                model_blessing=model_blessing,
                examples=examples,
                serving_dir=serving_dir,
                model_name=model_name,
                label=label,
                push_config=push_config,
                pushed_model=channel.Channel(type=standard_artifacts.PushedModel),
            )
        )
