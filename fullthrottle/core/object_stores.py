"""Which URI schemes a Kubeflow root (`pipeline_root`, `input_base`, `serving_dir`) may use.

Every component reads and writes its root through several file layers: TensorFlow's
`tf.io.gfile` (SavedModels, TFRecords, Transform's graph, checkpoints), TFX's `fileio` (which
uses TensorFlow's), Apache Beam's `FileSystems` (the data steps' reads and writes) and, for the
Trainer's tracked artifacts, MLflow's artifact stores. A scheme works only when all of them have
it in the project's environment and images; `tests/test_object_stores.py` checks both tables
below against the installed packages.
"""

from __future__ import annotations

import types
from collections.abc import Mapping

from fullthrottle.core.errors import ConfigError

# scheme -> what provides it in each layer.
OFFERED: Mapping[str, str] = types.MappingProxyType(
    {
        "gs": "Google Cloud Storage: TensorFlow's own gs:// filesystem, Beam's GCS filesystem "
        "(apache-beam[gcp]) and google-cloud-storage for MLflow, all in the lock",
    }
)

# scheme -> why it does not work here and what to do instead.
REFUSED: Mapping[str, str] = types.MappingProxyType(
    {
        "s3": "TensorFlow 2.21 has no s3:// filesystem of its own, and tensorflow-io, which adds "
        "one, has no build for Python 3.13 (its last release, 0.37.1, stops at 3.12), so "
        "SavedModels and Transform's graph could not be written there. Use a volume "
        "(kubeflow.volume, a PersistentVolumeClaim) or a gs:// URI",
        "hdfs": "TensorFlow 2.21's hdfs:// filesystem needs libhdfs and a Hadoop client in the "
        "image, which it does not have. Use a volume (kubeflow.volume) or a gs:// URI",
        "az": "TensorFlow has no az:// filesystem. Use a volume (kubeflow.volume) or a gs:// URI",
        "azfs": "TensorFlow has no azfs:// filesystem. Use a volume (kubeflow.volume) or a gs:// URI",
        "abfs": "TensorFlow has no abfs:// filesystem. Use a volume (kubeflow.volume) or a gs:// URI",
    }
)


def scheme_of(location: str) -> str | None:
    """The URI scheme of `location` ("gs" for gs://bucket/x), None for a plain path."""
    head, sep, _ = location.partition("://")
    return head.lower() if sep and head.isascii() and head.isalnum() else None


def check_location(location: str, *, field: str) -> None:
    """Refuses an object-store location whose scheme the environment cannot write, saying why
    and what to use instead. A plain path passes (whether a volume holds it is checked where
    the volume is known)."""
    scheme = scheme_of(location)
    if scheme is None or scheme in OFFERED:
        return
    reason = REFUSED.get(
        scheme,
        f"{scheme}:// is not a filesystem TensorFlow, TFX and Beam all have here. Use a volume "
        "(kubeflow.volume) or a gs:// URI",
    )
    raise ConfigError(f"{location!r} cannot be used: {reason}", field=field)
