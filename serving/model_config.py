"""TF Serving's model config (`ModelServerConfig`), read for the one model this server serves.

`HandleReloadConfigRequest` (gRPC `ModelService`) hands the server a new `ModelServerConfig`;
`versions_and_labels` checks it as TF Serving's model service and server core do
(model_service_impl.cc, server_core.cc: only a `model_config_list`, no model listed twice, a
platform that is set and is "tensorflow") and returns what this server applies from it: the
version policy and the version labels of its model.

This server serves one model from one folder, so a config that lists another model, leaves
this one out, or moves it to another `base_path` is refused with UNIMPLEMENTED and a message
that says so (TF Serving would load, unload or move models).
"""

from __future__ import annotations

import os
from typing import Any

from serving.servables import VersionPolicy
from serving.status import StatusError, invalid_argument

TENSORFLOW_PLATFORM = "tensorflow"


def version_policy(policy: Any) -> VersionPolicy:
    """A `ServableVersionPolicy` proto as a `VersionPolicy` (unset: the newest version)."""
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return VersionPolicy("all")
    if choice == "specific":
        return VersionPolicy("specific", versions=tuple(sorted(set(policy.specific.versions))))
    # TF Serving serves at least one version under a latest policy (num_versions 0 is 1).
    num_versions = policy.latest.num_versions if choice == "latest" else 1
    return VersionPolicy("latest", num_versions=max(1, num_versions))


def versions_and_labels(
    config: Any, *, model_name: str, serving_dir: str
) -> tuple[VersionPolicy, dict[str, int]]:
    """The version policy and labels a `ModelServerConfig` gives `model_name`, or the status
    TF Serving (or, for what this server does not do, this server) answers."""
    if config.WhichOneof("config") != "model_config_list":
        raise invalid_argument(
            "ServerModelConfig type not supported by HandleReloadConfigRequest. Only "
            "ModelConfigList is currently supported"
        )
    entries = list(config.model_config_list.config)
    names: set[str] = set()
    for entry in entries:
        if entry.name in names:
            raise invalid_argument(
                f"Illegal to list model {entry.name} multiple times in config list"
            )
        names.add(entry.name)
    for entry in entries:
        if not entry.model_platform:
            raise invalid_argument(
                "Illegal setting neither ModelServerConfig::model_type (deprecated) nor "
                "ModelServerConfig::model_platform."
            )
        if entry.model_platform != TENSORFLOW_PLATFORM:
            raise invalid_argument(
                f"Model {entry.name} requests unsupported platform {entry.model_platform}"
            )
    others = sorted(names - {model_name})
    if others or model_name not in names:
        listed = ", ".join(sorted(names)) or "no model"
        raise StatusError(
            "UNIMPLEMENTED",
            f"fullthrottle serve serves one model, {model_name!r} from {serving_dir}; this config "
            f"lists {listed}. Send a config with that one model (its version policy and labels), "
            "or start another `fullthrottle serve` for another model.",
        )
    (entry,) = [e for e in entries if e.name == model_name]
    if entry.base_path and os.path.realpath(entry.base_path) != os.path.realpath(serving_dir):
        raise StatusError(
            "UNIMPLEMENTED",
            f"fullthrottle serve serves {model_name!r} from {serving_dir}; the config's base_path "
            f"{entry.base_path} is another folder. Restart `fullthrottle serve --model-dir` to "
            "serve another folder.",
        )
    return version_policy(entry.model_version_policy), dict(entry.version_labels)
