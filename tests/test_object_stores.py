"""The object-store schemes `fullthrottle/core/object_stores.py` offers and refuses, checked against
the packages installed here (the same lock the images install): an offered scheme must be a
filesystem of every layer that touches a root (TensorFlow, TFX's fileio, Beam, MLflow), and a
refused one must really be missing from TensorFlow, so that the refusal is the truth."""

from __future__ import annotations

import pytest
import tensorflow as tf
from apache_beam.io.filesystems import FileSystems
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from tfx.dsl.io import fileio, filesystem_registry

from fullthrottle.core.config import load_config
from fullthrottle.core.errors import ConfigError
from fullthrottle.core.object_stores import OFFERED, REFUSED, check_location, scheme_of


@pytest.mark.parametrize("scheme", sorted(OFFERED))
def test_an_offered_scheme_is_a_filesystem_of_every_layer(scheme):
    uri = f"{scheme}://bucket/root/file"
    assert scheme in tf.io.gfile.get_registered_schemes()
    # TFX's fileio picks TensorFlow's gfile for it (SavedModels, Transform's graph, TFRecords).
    plugin = filesystem_registry.DEFAULT_FILESYSTEM_REGISTRY.get_filesystem_for_path(uri)
    assert plugin.__name__ == "TensorflowFilesystem", plugin
    assert fileio.exists.__module__ == "tfx.dsl.io.fileio"
    # Beam's data steps read and write it.
    assert FileSystems.get_filesystem(uri).scheme() == scheme
    # MLflow stores artifacts there (the Trainer's tracked files).
    repository = get_artifact_repository(f"{scheme}://bucket/artifacts")
    assert type(repository).__name__ != "LocalArtifactRepository", repository


@pytest.mark.parametrize("scheme", sorted(REFUSED))
def test_a_refused_scheme_is_not_a_tensorflow_filesystem_here(scheme):
    assert scheme not in tf.io.gfile.get_registered_schemes()
    with pytest.raises(ConfigError) as refused:
        check_location(f"{scheme}://bucket/root", field="pipeline_root")
    message = str(refused.value)
    assert f"{scheme}://bucket/root" in message and "kubeflow.volume" in message
    # Refused where the config is read, naming the field, before anything is compiled.
    with pytest.raises(ConfigError, match=r"kubeflow\.serving_dir"):
        load_config(overrides=[f"kubeflow.serving_dir={scheme}://bucket/serving"])


def test_an_unknown_scheme_is_refused_and_paths_pass():
    with pytest.raises(ConfigError, match="not a filesystem TensorFlow, TFX and Beam all have"):
        check_location("wasb://container/root", field="input_base")
    check_location("/mnt/fullthrottle/data", field="input_base")
    check_location("gs://bucket/data", field="input_base")
    assert scheme_of("GS://b/x") == "gs" and scheme_of("/a/b") is None
