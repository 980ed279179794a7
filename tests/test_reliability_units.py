"""The gate's report, the schema importer and command, and secret redaction, each on its own."""

from __future__ import annotations

import dataclasses
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
    assert types["body_mass_g"] == "INT"
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
