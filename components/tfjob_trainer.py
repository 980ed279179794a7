"""The Trainer as a Kubeflow Training Operator TFJob: N workers running the same trainer code.

`tfjob_trainer(...)` is `tfx.components.Trainer` with a different executor (the TFX way, as TFX's
AI Platform trainer does): same inputs, outputs and `run_fn`, so the wiring in
`pipelines.pipeline` is unchanged. On Kubeflow its executor (`TFJobExecutor`, running in the
Trainer step's pod):

1. serializes its input and output artifacts and execution properties into the arguments of
   TFX's `tfx.scripts.run_executor`, the same command for every replica;
2. creates a TFJob (`components.tfjob_manifest`) of one Chief and `workers - 1` Workers running
   `WorkerExecutor` with those arguments; the operator sets `TF_CONFIG` in each pod;
3. waits for it, and fails with the job's own reason (and where the logs are) when it fails,
   or when it runs past `kubeflow.tfjob.timeout_minutes`;
4. checks that the chief exported the model where the Evaluator will look for it.

`WorkerExecutor` is TFX's GenericExecutor on every replica; only the chief (from TF_CONFIG, the
same rule the training library uses) is held to "a model was exported".
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, override

from tfx.components import Trainer
from tfx.components.trainer import executor as trainer_executor
from tfx.components.util import udf_utils
from tfx.dsl.components.base import base_executor, executor_spec
from tfx.dsl.io import fileio
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import json_utils, path_utils

from components.tfjob_manifest import (
    GROUP,
    PLURAL,
    VERSION,
    build_tfjob_manifest,
    job_state,
    tfjob_name,
)
from fullthrottle.core.errors import FullthrottleError

TFJOB_KEY = "fullthrottle_tfjob"  # in the Trainer's custom_config
# What every replica runs: TFX's executor script, with our worker executor.
WORKER_COMMAND = ("python", "-m", "tfx.scripts.run_executor")
_REQUEST_TIMEOUT = (10, 60)  # (connect, read) seconds for each Kubernetes API call

log = logging.getLogger(__name__)


class TFJobError(FullthrottleError):
    """The TFJob could not be created, failed, or ran out of time; the message says which job."""


def tfjob_settings(config: Any) -> dict[str, Any]:
    """The JSON-safe TFJob settings from a validated `Config` (what the executor needs in-cluster)."""
    kf = config.kubeflow
    tfjob = kf.tfjob
    resources = tfjob.resources.over(kf.resources.for_step("trainer"))
    # Replicas with GPUs run the GPU-capable image; CPU-only ones the smaller one if set.
    with_gpu = bool(resources.accelerator_type and resources.accelerator_count)
    return {
        "pipeline_name": config.pipeline_name,
        "workers": tfjob.workers,
        "image": tfjob.image or (kf.image if with_gpu else kf.cpu_image or kf.image),
        "namespace": kf.namespace,
        "resources": dataclasses.asdict(resources),
        "timeout_minutes": tfjob.timeout_minutes,
        "poll_seconds": tfjob.poll_seconds,
        "clean_pod_policy": tfjob.clean_pod_policy,
        "service_account": tfjob.service_account,
        "termination_grace_period_seconds": kf.termination_grace_period_seconds,
        "retries": kf.trainer_retries,
        # The replicas read and write the same roots as the pipeline's steps: the same volume.
        "volume": dataclasses.asdict(kf.volume) if kf.volume.claim_name else None,
    }


def tfjob_trainer(
    *, tfjob: Mapping[str, Any], custom_config: Mapping[str, Any] | None = None, **trainer_args: Any
) -> Any:
    """`tfx.components.Trainer(**trainer_args)` whose execution is a TFJob described by `tfjob`."""
    return Trainer(
        custom_executor_spec=executor_spec.ExecutorClassSpec(TFJobExecutor),
        custom_config={**(custom_config or {}), TFJOB_KEY: dict(tfjob)},
        **trainer_args,
    )


def _custom_config(exec_properties: Mapping[str, Any]) -> dict[str, Any]:
    raw = exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY)
    value = json_utils.loads(raw) if isinstance(raw, str) else raw
    return dict(value or {})


def worker_args(
    input_dict: Mapping[str, list[Any]],
    output_dict: Mapping[str, list[Any]],
    exec_properties: Mapping[str, Any],
) -> list[str]:
    """`tfx.scripts.run_executor` arguments that make a replica run `WorkerExecutor` on exactly
    this execution's artifacts (base64: the JSON holds quotes and newlines)."""

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    properties = {k: v for k, v in exec_properties.items() if v is not None}
    return [
        "--executor_class_path",
        f"{WorkerExecutor.__module__}.{WorkerExecutor.__qualname__}",
        "--inputs-base64",
        b64(artifact_utils.jsonify_artifact_dict(dict(input_dict))),
        "--outputs-base64",
        b64(artifact_utils.jsonify_artifact_dict(dict(output_dict))),
        "--exec-properties-base64",
        b64(json.dumps(properties)),
    ]


class WorkerExecutor(trainer_executor.GenericExecutor):
    """GenericExecutor on one TFJob replica: every replica trains, only the chief must export."""

    @override
    def Do(
        self,
        input_dict: dict[str, list[Any]],
        output_dict: dict[str, list[Any]],
        exec_properties: dict[str, Any],
    ) -> None:
        from trainer_module.training.strategy import cluster_info

        if cluster_info().is_chief:
            super().Do(input_dict, output_dict, exec_properties)
            return
        # Non-chief replicas take part in every all-reduce but export nothing (run_fn returns
        # early), so GenericExecutor's "a model was exported" check does not apply to them.
        fn_args = self._GetFnArgs(input_dict, output_dict, exec_properties)
        udf_utils.get_fn(exec_properties, "run_fn")(fn_args)


class TFJobExecutor(base_executor.BaseExecutor):
    """Runs the Trainer as a TFJob and waits for it (see the module docstring)."""

    @override
    def Do(
        self,
        input_dict: dict[str, list[Any]],
        output_dict: dict[str, list[Any]],
        exec_properties: dict[str, Any],
    ) -> None:
        self._log_startup(input_dict, output_dict, exec_properties)
        settings = _custom_config(exec_properties).get(TFJOB_KEY)
        if not settings:
            raise TFJobError(
                f"the Trainer's custom_config has no {TFJOB_KEY!r}: build it with tfjob_trainer()"
            )
        model_uri = artifact_utils.get_single_uri(output_dict[standard_component_specs.MODEL_KEY])
        manifest = build_tfjob_manifest(
            settings,
            name=tfjob_name(pipeline_name=settings["pipeline_name"], execution_key=model_uri),
            command=WORKER_COMMAND,
            args=worker_args(input_dict, output_dict, exec_properties),
        )
        run_tfjob(manifest, poll_seconds=float(settings["poll_seconds"]))
        serving_model_dir = path_utils.serving_model_dir(model_uri)
        if not fileio.exists(serving_model_dir):
            name = manifest["metadata"]["name"]
            raise TFJobError(
                f"TFJob {name} succeeded but its chief exported no model to {serving_model_dir}; "
                f"see the chief's log: kubectl -n {manifest['metadata']['namespace']} logs {name}-chief-0"
            )


# --- talking to Kubernetes ------------------------------------------------------------------
def custom_objects_api() -> Any:
    """The cluster's API: in-cluster credentials in a pod, else the kubeconfig (KUBECONFIG)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError, TypeError) as exc:
            raise TFJobError(
                "no Kubernetes credentials: not running in a pod and no usable kubeconfig "
                f"({exc}); set KUBECONFIG or run the Trainer step inside the cluster"
            ) from None
    return client.CustomObjectsApi()


def _api_host(api: Any) -> str:
    return getattr(getattr(api.api_client, "configuration", None), "host", "the Kubernetes API")


def run_tfjob(
    manifest: Mapping[str, Any],
    *,
    poll_seconds: float,
    api: Any | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Creates the TFJob (or adopts the one a retried step already created) and waits until it
    succeeds; raises `TFJobError` naming the job when it cannot be created, fails, or outlives
    its `activeDeadlineSeconds` by more than two polls. Returns its final status."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    api = api or custom_objects_api()
    name = manifest["metadata"]["name"]
    namespace = manifest["metadata"]["namespace"]
    where = f"TFJob {namespace}/{name}"
    host = _api_host(api)
    logs_hint = f"logs: kubectl -n {namespace} logs {name}-chief-0 (workers: {name}-worker-<i>)"
    try:
        api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, dict(manifest), _request_timeout=_REQUEST_TIMEOUT
        )
        log.info("created %s", where)
    except ApiException as exc:
        if exc.status != 409:
            raise TFJobError(
                f"creating {where} at {host} was refused: HTTP {exc.status} {exc.reason}. Check that the "
                "Training Operator is installed (kubectl get crd tfjobs.kubeflow.org) and that the "
                f"pipeline's service account may create tfjobs in namespace {namespace!r}"
            ) from None
        log.info("%s already exists (a retried step): waiting for it", where)
    except (HTTPError, OSError) as exc:
        raise TFJobError(
            f"cannot reach the Kubernetes API at {host} to create {where}: {exc}"
        ) from None

    deadline = (
        time.monotonic() + manifest["spec"]["runPolicy"]["activeDeadlineSeconds"] + 2 * poll_seconds
    )
    while True:
        try:
            job = api.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=_REQUEST_TIMEOUT
            )
        except ApiException as exc:
            raise TFJobError(
                f"reading {where} at {host} failed: HTTP {exc.status} {exc.reason}"
            ) from None
        except (HTTPError, OSError) as exc:
            raise TFJobError(
                f"lost the Kubernetes API at {host} while waiting for {where}: {exc}"
            ) from None
        state, message = job_state(job.get("status"))
        if state == "Succeeded":
            log.info("%s succeeded", where)
            return job.get("status") or {}
        if state == "Failed":
            raise TFJobError(f"{where} failed: {message}; {logs_hint}")
        if time.monotonic() > deadline:
            raise TFJobError(
                f"{where} did not finish within kubeflow.tfjob.timeout_minutes (state {state}: {message}); {logs_hint}"
            )
        sleep(poll_seconds)
