"""Outside this project: the logged MLflow model in a fresh venv, and `pip install .`.

One fresh virtual environment, built from the wheels `bin/envrun` keeps (its wheelhouse,
FULLTHROTTLE_WHEELHOUSE; `pip install --no-index`, nothing from the network), in this order:
1. only what the logged model's own requirements.txt lists: the model, copied out of the run's
   MLflow artifact store, is loaded with `mlflow.pyfunc.load_model` and served with
   `mlflow models serve` (127.0.0.1) from that venv, where `import fullthrottle` fails;
2. then `pip install` of a copy of this project (no --no-deps: pip resolves the declared
   dependencies), and `fullthrottle serve|compile|submit --help` from the venv's console script.
The order is fixed in one fixture: step 2 needs no model, step 1 must not see the project.
Marked `external` (about 4 minutes here, mostly unpacking TensorFlow's and TFX's wheels): run by
`make test-external`, CI's own step for checks of systems outside the project.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import pytest

from fullthrottle.tracking.store import scoped_tracking_uri
from tests.helpers import REPO, last_run

pytestmark = [pytest.mark.slow, pytest.mark.external]

# JSON as clients write it: whole numbers as integers (215) or with a point (215.0), a missing
# value as null.
ROWS = [
    {"bill_length_mm": 39.1, "bill_depth_mm": 18.7, "flipper_length_mm": 181, "body_mass_g": 3750,
     "island": "Torgersen", "sex": "male"},
    {"bill_length_mm": 46.5, "bill_depth_mm": 15.0, "flipper_length_mm": 220, "body_mass_g": 5200,
     "island": "Biscoe", "sex": "female"},
    {"bill_length_mm": 50.0, "bill_depth_mm": 15.2, "flipper_length_mm": 215.0,
     "body_mass_g": 5700.0, "island": "Biscoe", "sex": None},
]  # fmt: skip
CSV_ROWS = 20  # the first rows of the bundled penguins.csv, missing cells included
LOAD = """
import json, sys
import pandas as pd
import mlflow.pyfunc
try:
    import fullthrottle  # noqa: F401
    found = True
except ModuleNotFoundError:
    found = False
model = mlflow.pyfunc.load_model(sys.argv[1])
answer = model.predict(pd.DataFrame(json.loads(sys.argv[2])))
# The most common call there is: a CSV as pandas reads it (a column with a missing cell is
# float64, the missing cell NaN), the label and an unused column still in it.
from_csv = model.predict(pd.read_csv(sys.argv[3]))
print(json.dumps({"fullthrottle_importable": found, "answer": answer.to_dict(orient="list"),
                  "from_csv": from_csv.to_dict(orient="list")},
                 default=lambda value: value.tolist()))
"""


@dataclass
class Portable:
    model_dir: Path
    requirements: list[str]
    installed_before_project: set[str]
    load: dict = field(default_factory=dict)
    served: dict = field(default_factory=dict)
    serve_listening: list = field(default_factory=list)
    helps: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp: Path) -> dict[str, str]:
    """No project on the path, no pip settings from outside, a temp folder of its own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_FIND_LINKS", "PIP_CONSTRAINT"))
    }
    env.pop("PYTHONPATH", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    env["TMPDIR"] = str(tmp)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _run(*command: str | Path, env: dict[str, str], cwd: Path, timeout: float = 900) -> str:
    done = subprocess.run(
        [str(c) for c in command], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{' '.join(map(str, command))[:300]}:\n{done.stderr[-5000:]}"
    return done.stdout


def _project_copy(target: Path) -> Path:
    """The project's files as git sees them (tracked and new, not ignored): pip builds in place."""
    import shutil

    names = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, names):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _serve(venv: Path, model_dir: Path, env: dict[str, str], cwd: Path) -> tuple[dict, list]:
    port = _free_port()
    log = cwd / "serve.log"
    process = subprocess.Popen(
        [str(venv / "bin" / "mlflow"), "models", "serve", "-m", str(model_dir),
         "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
        env=env, cwd=cwd, stdout=open(log, "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations",
            data=json.dumps({"dataframe_records": ROWS}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
        server = psutil.Process(process.pid)
        listening = [
            c.laddr
            for p in [server, *server.children(recursive=True)]
            for c in p.connections(kind="tcp")  # psutil in the lock predates net_connections
            if c.status == psutil.CONN_LISTEN
        ]
        return answer, listening
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def portable(penguins_run, tmp_path_factory) -> Portable:
    import mlflow
    from mlflow.tracking import MlflowClient

    wheelhouse = os.environ.get("FULLTHROTTLE_WHEELHOUSE", "")
    if not Path(wheelhouse).is_dir():
        pytest.fail(
            "these tests install from the wheels bin/envrun downloads (FULLTHROTTLE_WHEELHOUSE); "
            "run them through bin/envrun (make test)"
        )
    output_dir, _ = penguins_run
    root = tmp_path_factory.mktemp("portable")
    (root / "tmp").mkdir()
    env = _env(root / "tmp")
    seconds = {}
    started = time.monotonic()
    # The model the run registered, out of its MLflow artifact store (the run's embedded store).
    store = f"sqlite:///{output_dir / 'mlflow' / 'mlflow.db'}"
    registered = MlflowClient(tracking_uri=store, registry_uri=store).get_model_version_by_alias(
        "penguins", "champion"
    )
    assert registered.source.startswith("models:/m-"), registered.source  # the logged model
    # MLflow resolves a logged model's artifacts through the process's tracking URI.
    with scoped_tracking_uri(store):
        model_dir = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=registered.source, dst_path=str(root / "model")
            )
        )
    requirements = (model_dir / "requirements.txt").read_text().split()
    venv = root / "venv"
    # The interpreter this environment's venv was made from: Python 3.13, nothing installed.
    _run(Path(sys.base_prefix) / "bin" / "python3", "-m", "venv", venv, env=env, cwd=root)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-index",
           "--find-links", wheelhouse]  # fmt: skip
    _run(*pip, "-r", model_dir / "requirements.txt", env=env, cwd=root)
    installed = json.loads(_run(venv / "bin" / "python", "-m", "pip", "list", "--format=json",
                                env=env, cwd=root))  # fmt: skip
    seconds["model venv"] = time.monotonic() - started
    portable = Portable(
        model_dir=model_dir,
        requirements=requirements,
        installed_before_project={p["name"].lower() for p in installed},
        seconds=seconds,
    )
    (root / "load.py").write_text(LOAD)
    csv_file = root / "penguins_head.csv"
    csv_file.write_text(_bundled_head(CSV_ROWS))
    step = time.monotonic()
    portable.load = json.loads(
        _run(venv / "bin" / "python", root / "load.py", model_dir, json.dumps(ROWS), csv_file,
             env=env, cwd=root).strip().splitlines()[-1]
    )  # fmt: skip
    portable.served, portable.serve_listening = _serve(venv, model_dir, env, root)
    seconds["load and serve"] = time.monotonic() - step
    step = time.monotonic()
    _run(*pip, _project_copy(root / "project"), env=env, cwd=root)
    seconds["pip install ."] = time.monotonic() - step
    step = time.monotonic()
    for command in ("serve", "compile", "submit"):
        portable.helps[command] = subprocess.run(
            [str(venv / "bin" / "fullthrottle"), command, "--help"],
            env=env, cwd=root, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    seconds["--help x3"] = time.monotonic() - step
    print(f"portable venv timings: {seconds}")
    return portable


def _bundled_head(rows: int) -> str:
    from fullthrottle.core.bundled import bundled_path
    from fullthrottle.core.config import BUNDLED_PENGUINS

    return "\n".join(bundled_path(BUNDLED_PENGUINS).read_text().splitlines()[: rows + 1]) + "\n"


def _direct(pushed_dir: str):
    """The pushed SavedModel's predict_raw on ROWS: numbers as float32, a missing text as ""."""
    import tensorflow as tf

    signature = tf.saved_model.load(pushed_dir).signatures["predict_raw"]
    specs = signature.structured_input_signature[1]
    return signature(
        **{
            name: tf.constant(
                [("" if row[name] is None else row[name]) for row in ROWS],
                dtype=spec.dtype,
            )
            for name, spec in specs.items()
        }
    )


def test_the_logged_model_loads_where_fullthrottle_is_not_installed(portable, penguins_run):
    # Pinned requirements of its own, and nothing of this project.
    assert {r.split("==")[0] for r in portable.requirements} == {
        "mlflow-skinny", "tensorflow", "pandas", "numpy",
    }  # fmt: skip
    assert all("==" in r for r in portable.requirements)
    assert "fullthrottle" not in portable.installed_before_project
    assert portable.load["fullthrottle_importable"] is False
    answer = portable.load["answer"]
    direct = _direct(last_run(penguins_run[0])["pushed_model_dir"])
    # Class names as text, the SavedModel's own answer, with its probabilities.
    assert answer["class"] == [c.decode() for c in direct["classes"].numpy()]
    assert all(isinstance(c, str) for c in answer["class"])
    np.testing.assert_allclose(answer["probabilities"], direct["probabilities"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(
        answer["probability"], direct["probabilities"].numpy().max(axis=1), rtol=1e-6
    )


def test_pandas_read_csv_with_missing_cells_answers_as_csv_predict(portable, penguins_run):
    """`model.predict(pd.read_csv(...))` in the fresh venv, missing cells included, gives the
    classes and probabilities the served model gives the same CSV rows sent as tf.Examples
    (what `fullthrottle predict --csv` sends: a missing cell left out)."""
    import tensorflow as tf

    from fullthrottle.commands.predict import csv_to_examples
    from fullthrottle.core.config import load_config

    examples, _ = csv_to_examples(_bundled_head(CSV_ROWS), load_config(None), source="csv")
    pushed = tf.saved_model.load(last_run(penguins_run[0])["pushed_model_dir"])
    direct = pushed.signatures["serving_default"](examples=tf.constant(examples))
    from_csv = portable.load["from_csv"]
    assert len(from_csv["class"]) == CSV_ROWS
    assert from_csv["class"] == [c.decode() for c in direct["classes"].numpy()]
    np.testing.assert_allclose(
        from_csv["probabilities"], direct["probabilities"].numpy(), rtol=1e-5, atol=1e-7
    )


def test_mlflow_models_serve_answers_json_with_class_names(portable, penguins_run):
    direct = _direct(last_run(penguins_run[0])["pushed_model_dir"])
    predictions = portable.served["predictions"]
    assert [p["class"] for p in predictions] == [c.decode() for c in direct["classes"].numpy()]
    np.testing.assert_allclose(
        [p["probabilities"] for p in predictions], direct["probabilities"].numpy(), rtol=1e-6
    )
    assert portable.serve_listening and all(a.ip == "127.0.0.1" for a in portable.serve_listening)


def test_pip_install_gives_a_working_command(portable):
    for command, done in portable.helps.items():
        assert done.returncode == 0, (command, done.stderr[-3000:])
        assert done.stdout.startswith(f"usage: fullthrottle {command}"), done.stdout[:200]
