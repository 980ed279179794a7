"""The Kubeflow Training Operator `TFJob` that runs the Trainer on N workers: pure functions.

`build_tfjob_manifest` turns the TFJob settings (from `kubeflow.tfjob`, see
`components.tfjob_trainer.tfjob_settings`) and one worker command into a `kubeflow.org/v1` TFJob:
one Chief and `workers - 1` Workers, every replica the same image and the same command, so they
run the same trainer code. The operator sets `TF_CONFIG` in each pod; the training library reads
it, builds MultiWorkerMirroredStrategy, and only the chief exports.

`job_state` reads a TFJob's `status` back into (state, message). Neither function talks to
Kubernetes; `components.tfjob_trainer` does.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

API_VERSION = "kubeflow.org/v1"
KIND = "TFJob"
PLURAL = "tfjobs"
GROUP, VERSION = API_VERSION.split("/")
# The operator finds the TensorFlow container by this name (ports, TF_CONFIG).
CONTAINER_NAME = "tensorflow"
VOLUME_NAME = "fullthrottle-roots"
# Pods killed from outside (exit 128+signal, e.g. preemption, OOM-kill, or the trainer's own stop on
# SIGTERM, which ends the process as a signal does) restart and resume from the last checkpoint; an
# error in the trainer (exit 1) fails the job at once instead of looping.
RESTART_POLICY = "ExitCode"
BACKOFF_LIMIT = 3  # restarts, unless `settings["retries"]` says otherwise
# Between SIGTERM and SIGKILL: the trainer finishes its loop and writes a checkpoint in it.
TERMINATION_GRACE_PERIOD_SECONDS = 300


def tfjob_name(*, pipeline_name: str, execution_key: str) -> str:
    """A DNS-1123 name that is the same for the same Trainer execution (so a retried step finds
    the job it already created instead of starting a second one) and short enough for the pod
    names the operator derives from it (`<name>-worker-12`)."""
    digest = hashlib.sha256(execution_key.encode()).hexdigest()[:10]
    prefix = (
        re.sub(r"[^a-z0-9-]+", "-", pipeline_name.lower()).strip("-")[:30].strip("-")
        or "fullthrottle"
    )
    return f"{prefix}-trainer-{digest}"


def _container_resources(resources: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if resources.get("cpu_request"):
        requests["cpu"] = str(resources["cpu_request"])
    if resources.get("memory_request"):
        requests["memory"] = str(resources["memory_request"])
    if resources.get("cpu_limit"):
        limits["cpu"] = str(resources["cpu_limit"])
    if resources.get("memory_limit"):
        limits["memory"] = str(resources["memory_limit"])
    if resources.get("accelerator_type") and resources.get("accelerator_count"):
        # Extended resources (GPUs) are set as limits; Kubernetes copies them to requests.
        limits[str(resources["accelerator_type"])] = str(int(resources["accelerator_count"]))
    out: dict[str, dict[str, str]] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def build_tfjob_manifest(
    settings: Mapping[str, Any],
    *,
    name: str,
    command: Sequence[str],
    args: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The TFJob for `settings["workers"]` replicas (chief included), all running `command args`.

    `settings` keys: workers, image, namespace, resources (cpu_request, cpu_limit, memory_request,
    memory_limit, accelerator_type, accelerator_count), timeout_minutes, clean_pod_policy,
    service_account, termination_grace_period_seconds, retries (optional) and volume (optional:
    claim_name and mount_path of a PVC every replica mounts). Refuses fewer than one worker.
    """
    workers = int(settings["workers"])
    if workers < 1:
        raise ValueError(f"a TFJob needs at least one replica (the chief), got workers={workers}")
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": settings["image"],
        "command": list(command),
        "args": list(args),
    }
    resources = _container_resources(settings.get("resources") or {})
    if resources:
        container["resources"] = resources
    volume = settings.get("volume")
    if volume:
        # The PVC of the pipeline's roots, mounted where the steps mount it.
        container["volumeMounts"] = [{"name": VOLUME_NAME, "mountPath": volume["mount_path"]}]
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # Preemption and eviction send SIGTERM, then SIGKILL after this many seconds: the trainer
        # stops at its next loop end and saves a checkpoint there, which the restart resumes from.
        "terminationGracePeriodSeconds": int(
            settings.get("termination_grace_period_seconds") or TERMINATION_GRACE_PERIOD_SECONDS
        ),
    }
    if settings.get("service_account"):
        pod_spec["serviceAccountName"] = settings["service_account"]
    if volume:
        pod_spec["volumes"] = [
            {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": volume["claim_name"]}}
        ]
    pod_labels = {"app.kubernetes.io/part-of": "fullthrottle", **(labels or {})}

    def replica(count: int) -> dict[str, Any]:
        return {
            "replicas": count,
            "restartPolicy": RESTART_POLICY,
            "template": {"metadata": {"labels": dict(pod_labels)}, "spec": pod_spec},
        }

    replica_specs = {"Chief": replica(1)}
    if workers > 1:
        replica_specs["Worker"] = replica(workers - 1)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": settings["namespace"], "labels": dict(pod_labels)},
        "spec": {
            "runPolicy": {
                "cleanPodPolicy": settings.get("clean_pod_policy", "Running"),
                "backoffLimit": int(settings.get("retries", BACKOFF_LIMIT)),
                "activeDeadlineSeconds": int(settings["timeout_minutes"]) * 60,
            },
            # The job succeeds when the chief does: it is the one that exports the model.
            "successPolicy": "",
            "tfReplicaSpecs": replica_specs,
        },
    }


def job_state(status: Mapping[str, Any] | None) -> tuple[str, str]:
    """("Succeeded" | "Failed" | "Running" | "Pending", message) from a TFJob's `status`.

    The operator appends conditions (Created, Running, Restarting, Succeeded, Failed); the last
    one whose status is "True" is the job's state.
    """
    conditions = [c for c in (status or {}).get("conditions") or [] if c.get("status") == "True"]
    if not conditions:
        return "Pending", "no condition reported yet"
    last = conditions[-1]
    kind = last.get("type", "")
    message = " ".join(p for p in (last.get("reason"), last.get("message")) if p) or kind
    if kind in ("Succeeded", "Failed"):
        return kind, message
    if kind in ("Running", "Restarting"):
        return "Running", message
    return "Pending", message
