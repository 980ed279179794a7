"""The served model is protected: an unblessed run leaves the push folder and a running server alone."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from fullthrottle.bench.serving import free_port, start_server, stop_server
from tests.helpers import eval_split_examples, last_run, run_cli, served_dirs, strip_label

pytestmark = pytest.mark.slow


def _tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _predict(base: str, examples: list[bytes]) -> tuple[np.ndarray, str]:
    body = json.dumps(
        {"instances": [{"b64": base64.b64encode(e).decode()} for e in examples]}
    ).encode()
    request = urllib.request.Request(
        base + ":predict", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        payload = json.loads(response.read())
        version = response.headers["x-fullthrottle-model-version"]
    return np.array([p["probabilities"] for p in payload["predictions"]]), version


def test_unblessed_run_keeps_the_previous_version_served(penguins_run, tmp_path):
    source, _ = penguins_run
    # A copy of the whole run (metadata, artifacts, push folder), so the shared fixture is untouched;
    # cached components keep pointing at the fixture's artifacts, which are only read.
    output_dir = tmp_path / "run"
    shutil.copytree(source, output_dir)
    serving_dir = output_dir / "serving" / "penguins"
    versions_before = served_dirs(serving_dir)
    assert len(versions_before) == 1
    digest_before = _tree_digest(serving_dir)
    examples = [strip_label(r, "species") for r in eval_split_examples(last_run(source), limit=16)]

    port = free_port()
    process = start_server(
        str(serving_dir), model_name="penguins", port=port, overrides=("serving.poll_seconds=0.2",)
    )
    try:
        base = f"http://127.0.0.1:{port}/v1/models/penguins"
        before, version = _predict(base, examples)
        assert version == versions_before[0].name

        # One training step and a threshold no such model meets: the Evaluator does not bless it.
        result = run_cli(
            "run", "--output-dir", str(output_dir),
            "--set", "training.train_steps=1", "--set", "evaluation.accuracy_threshold=0.99",
        )  # fmt: skip
        assert result.returncode == 3, result.stderr[-4000:]
        assert "NOT blessed" in result.stdout
        assert last_run(output_dir)["pushed_model_dir"] is None

        assert served_dirs(serving_dir) == versions_before
        assert _tree_digest(serving_dir) == digest_before, (
            "an unblessed run changed the push folder"
        )
        after, version_after = _predict(base, examples)
        assert version_after == version
        np.testing.assert_array_equal(after, before)
    finally:
        output = stop_server(process)
    assert "Traceback" not in output, output[-3000:]
