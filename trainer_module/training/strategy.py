"""Distribution strategy: chosen from the environment (TF_CONFIG, GPUs), overridable in config.

Owns: reading TF_CONFIG, GPU memory growth, logical CPU devices, building the strategy, and
answering "am I the chief / which worker am I". Refuses: a multi-worker request without a
multi-worker TF_CONFIG, and a logical-CPU request TensorFlow can no longer honour.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from dataclasses import dataclass

import tensorflow as tf

from trainer_module.training.config import TrainingConfig
from trainer_module.training.errors import ConfigError

# Every MirroredStrategy starts its collective group keys at 1 + the class attribute
# `_collective_key_base` (0 unless set; TensorFlow's own tests bump it). So a second strategy in
# one process (a notebook training twice, the test suite) reuses the first one's collective
# instances, and when its model's gradients have other shapes the all-reduce aborts with "Shape
# mismatch in the collective instance" (seen: a tabular then a Transformer run). Each strategy
# built here gets its own key range.
_MIRRORED_KEY_STRIDE = 1_000_000
_mirrored_key_bases = itertools.count()


def _mirrored_strategy(devices: list[str]) -> tf.distribute.MirroredStrategy:
    tf.distribute.MirroredStrategy._collective_key_base = (
        next(_mirrored_key_bases) * _MIRRORED_KEY_STRIDE
    )
    return tf.distribute.MirroredStrategy(devices)


@dataclass(frozen=True)
class ClusterInfo:
    """This process's place in the cluster (from TF_CONFIG; a lone process is a 1-worker chief)."""

    num_workers: int  # chief + workers (evaluators and parameter servers are not counted)
    task_type: str | None
    task_id: int
    is_chief: bool
    worker_index: int = 0  # index among training workers, chief first (the order MWMS uses)


def cluster_info() -> ClusterInfo:
    """Parse TF_CONFIG (read now, not at import). Chief = the "chief" task if the cluster has
    one (Kubeflow/Vertex), otherwise worker 0 (TensorFlow's convention)."""
    raw = os.environ.get("TF_CONFIG", "")
    if not raw.strip():
        return ClusterInfo(1, None, 0, True)
    try:
        tf_config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"TF_CONFIG is not valid JSON: {e}") from e
    cluster = tf_config.get("cluster", {}) or {}
    task = tf_config.get("task", {}) or {}
    task_type = task.get("type")
    task_id = int(task.get("index", 0))
    chiefs = len(cluster.get("chief", []) or [])
    workers = len(cluster.get("worker", []) or [])
    if chiefs:
        is_chief = task_type == "chief"
        worker_index = 0 if is_chief else chiefs + task_id
    else:
        is_chief = task_type in (None, "worker") and task_id == 0
        worker_index = task_id
    return ClusterInfo(chiefs + workers, task_type, task_id, is_chief, worker_index)


def enable_gpu_memory_growth() -> int:
    """Let TF grow GPU memory on demand (so several processes / data loaders can share a GPU).
    Returns the number of GPUs. Silently keeps the old setting if TF is already initialised."""
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        # Devices already initialised: the setting is fixed now.
        with contextlib.suppress(RuntimeError):
            tf.config.experimental.set_memory_growth(gpu, True)
    return len(gpus)


def logical_cpu_devices(n: int) -> list[str]:
    """Names of ``n`` logical CPU devices, creating them if TF has not initialised its devices.

    TF fixes its device list at first use; if that happened already, an existing set of at least
    ``n`` logical CPUs (e.g. the test conftest's two) is accepted and its first ``n`` are used.
    """
    cpus = tf.config.list_physical_devices("CPU")
    # Already initialised: check what exists below.
    with contextlib.suppress(RuntimeError):
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
    logical = tf.config.list_logical_devices("CPU")
    if len(logical) < n:
        raise ConfigError(
            f"`num_logical_cpu_devices` is {n} but TensorFlow was already initialised with "
            f"{len(logical)} logical CPU device(s); set it before any TensorFlow op runs "
            "(e.g. call create_strategy() first in the process)"
        )
    return [d.name for d in logical[:n]]


def create_strategy(config: TrainingConfig) -> tf.distribute.Strategy:
    """Build the strategy. "auto": multi-worker if TF_CONFIG names >1 worker, else mirrored over
    all local GPUs (if >1) or ``num_logical_cpu_devices`` (if >1), else one device."""
    info = cluster_info()
    num_gpus = enable_gpu_memory_growth()
    kind = config.strategy
    if kind == "auto":
        if info.num_workers > 1:
            kind = "multi_worker"
        elif num_gpus > 1 or config.num_logical_cpu_devices > 1:
            kind = "mirrored"
        else:
            kind = "one_device"
    if kind == "multi_worker":
        if info.num_workers < 2:
            raise ConfigError(
                "`strategy` is 'multi_worker' but TF_CONFIG does not name several workers"
            )
        # Collective ops must be configured before TF initialises its runtime, so this has to be
        # the first TF work in the process. RING is portable (CPU); NCCL is picked on GPUs.
        impl = (
            tf.distribute.experimental.CommunicationImplementation.NCCL
            if num_gpus
            else tf.distribute.experimental.CommunicationImplementation.RING
        )
        return tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=impl
            )
        )
    if kind == "mirrored":
        if num_gpus:
            devices = [d.name for d in tf.config.list_logical_devices("GPU")]
        elif config.num_logical_cpu_devices > 1:
            devices = logical_cpu_devices(config.num_logical_cpu_devices)
        else:
            devices = ["/cpu:0"]
        return _mirrored_strategy(devices)
    if config.num_logical_cpu_devices > 1 and config.strategy == "one_device":
        raise ConfigError(
            "`num_logical_cpu_devices` > 1 needs `strategy` 'mirrored' or 'auto', not 'one_device'"
        )
    return tf.distribute.OneDeviceStrategy("/gpu:0" if num_gpus else "/cpu:0")


def strategy_name(strategy: tf.distribute.Strategy) -> str:
    """Public name (MultiWorkerMirroredStrategy's class is CollectiveAllReduceStrategy)."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "MultiWorkerMirroredStrategy"
    return type(strategy).__name__


def agree_any(strategy: tf.distribute.Strategy, flag: bool, num_workers: int) -> bool:
    """True if any worker says True: decisions taken from a worker's own clock (a checkpoint due
    by time) must be the same on every worker, or the collectives inside them would hang. One
    scalar all-reduce (a sync point) with several workers; ``flag`` itself with one."""
    if num_workers <= 1:
        return flag
    value = strategy.run(lambda: tf.constant(1.0 if flag else 0.0))
    # A SUM over replicas is > 0 iff any flag is set (tf.distribute.ReduceOp has no MAX).
    return bool(strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None).numpy() > 0.5)
