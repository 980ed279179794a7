"""The committed deploy kit is the generator's output for the default config, and it agrees."""

from __future__ import annotations

import re

import yaml

from fullthrottle.core.config import load_config
from serving.deploy_kit import KIT_FILES, render_kit
from tests.helpers import REPO, run_cli

KIT_DIR = REPO / "serving" / "deploy"


def test_committed_kit_matches_the_generator():
    rendered = render_kit(load_config(), kit_dir=KIT_DIR, project_root=REPO)
    assert sorted(rendered) == sorted(KIT_FILES)
    for name, text in rendered.items():
        committed = (KIT_DIR / name).read_text(encoding="utf-8")
        assert committed == text, (
            f"serving/deploy/{name} is stale: run `fullthrottle deploy-kit --kit-dir serving/deploy`"
        )
        # Written out in full: no YAML anchors or aliases (`&id001`, `*id001`) to chase.
        if name.endswith(".yaml"):
            assert not re.search(r"[&*]id\d+", text), name


def test_names_paths_and_ports_agree_across_the_kit():
    config = load_config(
        overrides=["model_name=herons", "serving.rest_port=9601", "serving.grpc_port=9600"]
    )
    kit = render_kit(config, kit_dir=REPO / "kit", project_root=REPO)
    models_config = kit["models.config"]
    assert 'name: "herons"' in models_config
    base_path = re.search(r'base_path: "([^"]+)"', models_config).group(1)
    assert base_path == "/models/herons"

    (service,) = yaml.safe_load(kit["docker-compose.yaml"])["services"].values()
    assert service["ports"] == ["9601:9601", "9600:9600"]
    assert "--rest_api_port=9601" in service["command"] and "--port=9600" in service["command"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
    assert mounts[base_path] == "../runs/serving/herons"  # relative to the kit folder
    config_file = next(
        a.split("=", 1)[1] for a in service["command"] if a.startswith("--model_config_file=")
    )
    assert mounts[config_file] == "./models.config"

    config_map, deployment, k8s_service = yaml.safe_load_all(kit["kubernetes.yaml"])
    assert config_map["data"]["models.config"] == models_config
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert {p["containerPort"] for p in container["ports"]} == {9600, 9601}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v1/models/herons", "port": 9601}
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {base_path}
    assert {p["port"] for p in k8s_service["spec"]["ports"]} == {9600, 9601}

    isvc = yaml.safe_load(kit["inferenceservice.yaml"])
    assert isvc["kind"] == "InferenceService" and isvc["metadata"]["name"] == "herons"
    claim = deployment["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"][
        "claimName"
    ]
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == f"pvc://{claim}/"


def test_deploy_kit_command_writes_the_kit(tmp_path):
    result = run_cli(
        "deploy-kit", "--kit-dir", str(tmp_path / "kit"), "--set", "serving.max_batch_size=32"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "kit").iterdir()) == sorted(KIT_FILES)
    assert "max_batch_size { value: 32 }" in (tmp_path / "kit" / "batching.config").read_text()
    bad = run_cli(
        "deploy-kit", "--kit-dir", str(tmp_path / "kit2"), "--set", "serving.rest_port=8500"
    )
    assert bad.returncode == 2 and "must differ" in bad.stderr


def test_version_labels_reach_models_config_and_the_config_map():
    config = load_config(
        overrides=["serving.version_labels.stable=3", "serving.version_labels.canary=4"]
    )
    kit = render_kit(config, kit_dir=REPO / "kit", project_root=REPO)
    models_config = kit["models.config"]
    assert 'version_labels { key: "canary" value: 4 }' in models_config
    assert 'version_labels { key: "stable" value: 3 }' in models_config
    config_map = next(iter(yaml.safe_load_all(kit["kubernetes.yaml"])))
    assert config_map["data"]["models.config"] == models_config
    (service,) = yaml.safe_load(kit["docker-compose.yaml"])["services"].values()
    # Labels moved by a regenerated kit are picked up without a restart.
    assert "--model_config_file_poll_wait_seconds=60" in service["command"]
    isvc = yaml.safe_load(kit["inferenceservice.yaml"])
    assert (
        isvc["spec"]["predictor"]["model"]["runtimeVersion"] == config.serving.image.split(":")[1]
    )
    assert (
        "version_labels"
        not in render_kit(load_config(), kit_dir=REPO, project_root=REPO)["models.config"]
    )


def test_a_label_that_is_not_a_path_segment_is_refused():
    import pytest

    from fullthrottle.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"serving.version_labels"):
        load_config(overrides=["serving.version_labels.a/b=3"])
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["serving.version_labels.stable=0"])
    assert str(info.value) == "`serving.version_labels.stable` must be > 0, got 0"
