"""Shared test set-up.

TensorFlow fixes its device list at first use, so the two logical CPU devices that the
distribution tests need (MirroredStrategy over 2 replicas without a GPU) are configured here,
before any test imports a model. Code under test that asks for 2 logical devices finds them.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)
