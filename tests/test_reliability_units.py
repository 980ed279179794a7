"""The gate's report, the schema importer and command, and secret redaction, each on its own."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2

from components.data_gate import MAX_REPORTED, format_report, read_anomalies
from fullthrottle import cli
from fullthrottle.core.bundled import PENGUINS_SCHEMA, bundled_path
from fullthrottle.core.config import load_config
from fullthrottle.core.errors import DataError
from fullthrottle.core.redact import REDACTED, redact, redact_text
from fullthrottle.core.staging import prepare_data
from tests.helpers import last_run


def _write_anomalies(root: Path, split: str, features: dict[str, tuple[int, str]]) -> None:
    proto = anomalies_pb2.Anomalies()
    for name, (kind, description) in features.items():
        info = proto.anomaly_info[name]
        info.description = description
        reason = info.reason.add()
        reason.type = kind
        reason.description = description
    (root / f"Split-{split}").mkdir(parents=True)
    (root / f"Split-{split}" / "SchemaDiff.pb").write_bytes(proto.SerializeToString())


def test_anomalies_are_read_per_split_and_reported_readably(tmp_path):
    unexpected = anomalies_pb2.AnomalyInfo.ENUM_TYPE_UNEXPECTED_STRING_VALUES
    long_value = "Dream" * 10_000
    _write_anomalies(
        tmp_path,
        "train",
        {
            "species": (
                unexpected,
                "Examples contain values missing from the schema: Emperor (~2%).",
            ),
            "island": (
                unexpected,
                f"Examples contain values missing from the schema: {long_value}.",
            ),
        },
    )
    _write_anomalies(tmp_path, "eval", {})
    found = read_anomalies(str(tmp_path), ["train", "eval"])
    assert [(a.split, a.column, a.anomaly_type) for a in found] == [
        ("train", "island", "ENUM_TYPE_UNEXPECTED_STRING_VALUES"),
        ("train", "species", "ENUM_TYPE_UNEXPECTED_STRING_VALUES"),
    ]
    report = format_report(found, input_files="/data/p.csv", schema_source="/s/schema.pbtxt")
    assert "found 2 anomalies in /data/p.csv against the schema /s/schema.pbtxt" in report
    assert "split 'train', column 'species': ENUM_TYPE_UNEXPECTED_STRING_VALUES" in report
    assert "Emperor" in report
    assert long_value not in report and "characters)" in report
    assert len(report) < 2000


def test_report_counts_what_it_does_not_list(tmp_path):
    kind = anomalies_pb2.AnomalyInfo.SCHEMA_NEW_COLUMN
    _write_anomalies(
        tmp_path, "train", {f"c{i:02d}": (kind, "New column") for i in range(MAX_REPORTED + 5)}
    )
    found = read_anomalies(str(tmp_path), ["train"])
    report = format_report(found, input_files="x.csv", schema_source="s")
    assert f"found {MAX_REPORTED + 5} anomalies" in report
    assert "(and 5 more)" in report
    assert "'c24'" not in report


def test_a_missing_anomalies_file_is_refused_not_passed(tmp_path):
    _write_anomalies(tmp_path, "train", {})
    with pytest.raises(DataError, match="Split-eval"):
        read_anomalies(str(tmp_path), ["train", "eval"])


def test_curated_schema_describes_every_bundled_column():
    schema = text_format.Parse(PENGUINS_SCHEMA.read_text(), schema_pb2.Schema())
    header = bundled_path("palmerpenguins").read_text().splitlines()[0].split(",")
    assert sorted(f.name for f in schema.feature) == sorted(header)
    domains = {d.name: set(d.value) for d in schema.string_domain}
    assert domains["species"] == {"Adelie", "Chinstrap", "Gentoo"}


def test_schema_path_is_checked_before_the_pipeline(tmp_path):
    bad = tmp_path / "bad.pbtxt"
    bad.write_text("feature { name: 'species' type: NOT_A_TYPE }")
    config = load_config(overrides=[f"output_dir={tmp_path}", f"data.schema_path={bad}"])
    with pytest.raises(DataError, match="not a text-format TFMD Schema"):
        prepare_data(config)
    partial = tmp_path / "partial.pbtxt"
    partial.write_text('feature { name: "species" type: BYTES }')
    config = load_config(overrides=[f"output_dir={tmp_path}", f"data.schema_path={partial}"])
    with pytest.raises(DataError, match="'bill_length_mm'"):
        prepare_data(config)


def test_schema_command_writes_a_usable_schema_and_never_overwrites(tmp_path, capsys, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    output = tmp_path / "schema.pbtxt"
    assert cli.main(["schema", "--data", "palmerpenguins", "--output", str(output)]) == 0
    # Its staged data and what Beam and TFDV leave in temp folders went with its scratch folder.
    assert list(temp.iterdir()) == []
    schema = text_format.Parse(output.read_text(), schema_pb2.Schema())
    types = {f.name: schema_pb2.FeatureType.Name(f.type) for f in schema.feature}
    assert types["species"] == "BYTES" and types["bill_length_mm"] == "FLOAT"
    # Measurements are numbers, whole or not (staging writes them as decimals); year is no
    # numeric column and keeps the type of its cells.
    assert types["body_mass_g"] == "FLOAT" and types["year"] == "INT"
    # The written schema is accepted as data.schema_path by the pre-pipeline checks.
    prepare_data(
        load_config(overrides=[f"output_dir={tmp_path / 'out'}", f"data.schema_path={output}"])
    )

    output.write_text("# curated by hand\n")
    capsys.readouterr()
    assert cli.main(["schema", "--data", "palmerpenguins", "--output", str(output)]) == 2
    # The CLI wraps messages at 100 columns; a long path moves words onto the next line.
    assert "already exists" in " ".join(capsys.readouterr().err.split())
    assert output.read_text() == "# curated by hand\n"


def test_redact_replaces_secrets_and_keeps_ordinary_fields():
    value = {
        "password": "hunter2",
        "MLFLOW_TRACKING_TOKEN": "tok-123",
        "aws_secret_access_key": "abc",
        "tokenizer": "word",
        "max_tokens": 32,
        "extra_args": ["--runner=DirectRunner", "--s3_secret_access_key=abc123"],
        "tracking_uri": "https://alice:pa55@mlflow.example/api?token=xyz&run=3",
        "note": "header Authorization: Bearer abcdefghijklmnop, key AKIAABCDEFGHIJKLMNOP",
    }
    cleaned = redact(value)
    flat = repr(cleaned)
    for secret in (
        "hunter2",
        "tok-123",
        "abc123",
        "pa55",
        "xyz",
        "abcdefghijklmnop",
        "AKIAABCDEFGHIJKLMNOP",
    ):
        assert secret not in flat, secret
    assert cleaned["tokenizer"] == "word" and cleaned["max_tokens"] == 32
    assert cleaned["extra_args"][0] == "--runner=DirectRunner"
    assert cleaned["tracking_uri"].startswith(f"https://alice:{REDACTED}@mlflow.example")
    assert value["password"] == "hunter2", "redact returns a copy"


def test_default_config_is_unchanged_by_redaction():
    config = dataclasses.asdict(load_config())
    assert redact(config) == config


def test_redaction_leaves_plain_text_alone():
    assert redact_text("run 7 finished at 12:30, step=40") == "run 7 finished at 12:30, step=40"
    assert (
        redact_text("connecting to postgres://u:secretpw@db/x with api_key=k-999")
        == f"connecting to postgres://u:{REDACTED}@db/x with api_key={REDACTED}"
    )


def test_bundled_run_passes_the_gate_with_the_curated_schema(penguins_run):
    output_dir, _ = penguins_run
    components = last_run(output_dir)["components"]
    assert components["ImportSchema"]["state"] in ("complete", "cached")
    assert components["DataGate"]["state"] in ("complete", "cached")
    assert "SchemaGen" not in components


# --- a filesystem that is not the local disk -------------------------------------------------
def _to_ram(local: Path, target: str) -> str:
    """Copies a local folder into TensorFlow's in-memory filesystem (ram://)."""
    import tensorflow as tf

    for directory, _, files in tf.io.gfile.walk(str(local)):
        destination = target + "/" + str(Path(directory).relative_to(local)).strip(".")
        tf.io.gfile.makedirs(destination)
        for name in files:
            tf.io.gfile.copy(f"{directory}/{name}", f"{destination.rstrip('/')}/{name}")
    return target


def _artifact_dir(output_dir: Path, component: str, key: str) -> Path:
    (found,) = (output_dir / "pipeline_root" / "fullthrottle-penguins" / component / key).iterdir()
    return found


def test_the_gate_the_schema_import_and_the_pusher_work_on_a_non_local_filesystem(penguins_run):
    """ram:// (TensorFlow's in-memory filesystem, no network) stands in for gs:// and s3://: the
    components reach it only through TFX's fileio and tf.io.gfile, as they would an object store.
    The bundled run's artifacts are copied there; each executor runs on the copies."""
    import json
    import time

    import tensorflow as tf
    from tfx.types import standard_artifacts

    from components.data_gate import SCHEMA_FILE, DataGate, DataGateError, ImportSchema, file_digest
    from components.safe_pusher import Executor as PusherExecutor
    from serving.push import WARMUP_RELATIVE_PATH

    output_dir, _ = penguins_run
    root = f"ram://fileio-{time.monotonic_ns()}"

    def artifact(kind, uri, **properties):
        made = kind()
        made.uri = uri
        for name, value in properties.items():
            setattr(made, name, value)
        return made

    # ImportSchema reads its file from there and writes its artifact there.
    curated = _to_ram(PENGUINS_SCHEMA.parent, f"{root}/curated")
    schema_file = f"{curated}/{PENGUINS_SCHEMA.name}"
    imported = artifact(standard_artifacts.Schema, f"{root}/ImportSchema/schema")
    ImportSchema.EXECUTOR_SPEC.executor_class().Do(
        {},
        {"schema": [imported]},
        {"schema_file": schema_file, "schema_digest": file_digest(schema_file)},
    )
    written = tf.io.gfile.GFile(f"{imported.uri}/{SCHEMA_FILE}").read()
    assert text_format.Parse(written, schema_pb2.Schema()).feature

    # The gate reads the run's anomalies (none) and passes the schema on, both in ram://.
    splits = json.dumps(["train", "eval"])
    anomalies = artifact(
        standard_artifacts.ExampleAnomalies,
        _to_ram(_artifact_dir(output_dir, "ExampleValidator", "anomalies"), f"{root}/anomalies"),
        split_names=splits,
    )
    # Its cell checks re-read the CSV that ExampleGen read, there too.
    config = load_config()
    input_base = _to_ram(output_dir / "data" / config.pipeline_name, f"{root}/data")
    validated = artifact(standard_artifacts.Schema, f"{root}/DataGate/validated_schema")
    DataGate.EXECUTOR_SPEC.executor_class().Do(
        {"anomalies": [anomalies], "schema": [imported]},
        {"validated_schema": [validated]},
        {
            "input_files": "penguins.csv",
            "schema_source": schema_file,
            "input_base": input_base,
            "data_spec": json.dumps(dataclasses.asdict(config.data)),
        },
    )
    assert tf.io.gfile.listdir(validated.uri) == [SCHEMA_FILE]
    assert tf.io.gfile.GFile(f"{validated.uri}/{SCHEMA_FILE}").read() == written
    # A cell with a unit in a copy there stops the gate, named with its line: it read the copy.
    (csv_file,) = tf.io.gfile.glob(f"{input_base}/train/*.csv")
    lines = tf.io.gfile.GFile(csv_file).read().splitlines()
    column = lines[0].split(",").index("bill_length_mm")
    cells = lines[1].split(",")
    cells[column] += " mm"
    dirty_base = f"{root}/dirty"
    tf.io.gfile.makedirs(f"{dirty_base}/train")
    tf.io.gfile.copy(csv_file.replace("/train/", "/eval/"), f"{dirty_base}/eval/penguins.csv")
    with tf.io.gfile.GFile(f"{dirty_base}/train/penguins.csv", "w") as f:
        f.write("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    with pytest.raises(DataGateError, match=r"(?s)bill_length_mm.*train/penguins.csv line 2"):
        DataGate.EXECUTOR_SPEC.executor_class().Do(
            {"anomalies": [anomalies], "schema": [imported]},
            {"validated_schema": [artifact(standard_artifacts.Schema, f"{root}/DataGate/dirty")]},
            {
                "input_files": "penguins.csv",
                "schema_source": schema_file,
                "input_base": dirty_base,
                "data_spec": json.dumps(dataclasses.asdict(config.data)),
            },
        )

    # The Pusher publishes the run's model from ram:// into ram://, with its warmup records.
    model = artifact(
        standard_artifacts.Model,
        _to_ram(_artifact_dir(output_dir, "Trainer", "model"), f"{root}/Trainer/model"),
    )
    examples = artifact(
        standard_artifacts.Examples,
        _to_ram(_artifact_dir(output_dir, "ArrowExampleGen", "examples"), f"{root}/examples"),
        split_names=splits,
    )
    serving_dir = f"{root}/serving/penguins"
    push_config = json.dumps(
        {"warmup_requests": 8, "keep_versions": 0, "tflite": False, "tflite_quantize": False}
    )
    properties = {"serving_dir": serving_dir, "model_name": "penguins", "label": "species",
                  "push_config": push_config}  # fmt: skip
    pushed = artifact(standard_artifacts.PushedModel, f"{root}/Pusher/pushed_model")
    PusherExecutor().Do({"model": [model], "examples": [examples]}, {"pushed_model": [pushed]},
                        properties)  # fmt: skip
    version = pushed.get_string_custom_property("pushed_version")
    version_dir = pushed.get_string_custom_property("pushed_destination")
    assert version_dir == f"{serving_dir}/{version}" and version.isdigit()
    assert [n.rstrip("/") for n in tf.io.gfile.listdir(serving_dir)] == [version]
    records = list(tf.data.TFRecordDataset(f"{version_dir}/{WARMUP_RELATIVE_PATH}"))
    assert len(records) == 8
    loaded = tf.saved_model.load(version_dir)
    assert "predict_raw" in loaded.signatures
    # The Trainer's checkpoint folder stays on that filesystem too.
    from types import SimpleNamespace

    from trainer_module.run import stable_work_dir

    work_dir = stable_work_dir(
        SimpleNamespace(model_run_dir=f"{root}/Trainer/model_run/7/"), key_material={"a": 1}
    )
    assert work_dir.startswith(f"{root}/Trainer/training_state/"), work_dir
    # Pushed again (a rerun after a kill): the same version is found, nothing new published.
    again = artifact(standard_artifacts.PushedModel, f"{root}/Pusher/pushed_model_again")
    PusherExecutor().Do({"model": [model], "examples": [examples]}, {"pushed_model": [again]},
                        properties)  # fmt: skip
    assert again.get_string_custom_property("pushed_version") == version
    assert [n.rstrip("/") for n in tf.io.gfile.listdir(serving_dir)] == [version]


# --- a killed push's leftovers ------------------------------------------------------------------
_HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
"""


def test_staging_of_a_live_push_is_kept_and_of_a_killed_one_removed(tmp_path):
    from serving.push import remove_abandoned_folders

    serving_dir = tmp_path / "serving"
    live = serving_dir / ".staging-7-aaaaaaaa"
    (live / "variables").mkdir(parents=True)
    (serving_dir / "7").mkdir()  # a published version is never touched
    (serving_dir / ".deleting-3-bbbbbbbb").mkdir()  # retention killed mid-delete
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(live)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert remove_abandoned_folders(str(serving_dir)) == [".deleting-3-bbbbbbbb"]
        assert sorted(os.listdir(serving_dir)) == [".staging-7-aaaaaaaa", "7"]
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    # Its owner is dead (the kernel dropped the lock): the next push's clean-up removes it.
    assert remove_abandoned_folders(str(serving_dir)) == [".staging-7-aaaaaaaa"]
    assert sorted(os.listdir(serving_dir)) == ["7"]
