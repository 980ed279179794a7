"""The bad-input corpus: every case stops with a named message and pushes nothing.

Each case is built from the bundled penguins CSV (so only the named defect differs). "before"
cases run through the real CLI entry point (`fullthrottle.cli.main`, in this process so
TensorFlow and TFX are imported once for all cases) and stop in `fullthrottle.core.staging`
before any component runs. "gate" cases are checked in this process the way the pipeline checks
them (staging, TFDV statistics with CsvExampleGen's CSV decoder, ExampleValidator's validation
against the curated schema, the DataGate's cell checks and report); one of them also runs end to
end through the real ArrowExampleGen -> StatisticsGen -> ExampleValidator -> DataGate on Beam.

`docs/reliability.md` holds the same cases as a table; `test_docs_table_matches_the_corpus`
keeps the two in sync.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2

from components.data_gate import format_report
from fullthrottle import cli
from fullthrottle.core.bundled import PENGUINS_SCHEMA, bundled_path
from fullthrottle.outcome import read_latest_run
from tests.helpers import REPO, served_dirs

DOC = REPO / "docs" / "reliability.md"
SECRET = "SUPERSECRET123"


def _penguins() -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(bundled_path("palmerpenguins").read_text().splitlines()))
    return rows[0], rows[1:]


def _csv_text(header: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO(newline="")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def _with_cells(column: str, value: str, every: int = 40) -> Callable[[Path], list[str]]:
    """Penguins with `value` written into `column` of every `every`-th row."""

    def build(folder: Path) -> list[str]:
        header, rows = _penguins()
        index = header.index(column)
        for number, row in enumerate(rows):
            if number % every == 5:
                row[index] = value
        path = folder / "penguins.csv"
        path.write_text(_csv_text(header, rows))
        return ["--data", str(path)]

    return build


def _write(name: str, content: bytes | str, *extra: str) -> Callable[[Path], list[str]]:
    def build(folder: Path) -> list[str]:
        path = folder / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return ["--data", str(path), *extra]

    return build


def _penguin_text(
    transform: Callable[[list[str], list[list[str]]], tuple[list[str], list[list[str]]]],
):
    header, rows = _penguins()
    return _csv_text(*transform(header, [list(r) for r in rows]))


def _extra_column(folder: Path) -> list[str]:
    text = _penguin_text(lambda h, rows: ([*h, "wingspan_mm"], [[*r, "812"] for r in rows]))
    path = folder / "penguins.csv"
    path.write_text(text)
    # A secret in the config must not reach last_run.json (checked for every gate case).
    return ["--data", str(path), "--set", f'beam.extra_args=["--db_password={SECRET}"]']


def _nan_and_inf(folder: Path) -> list[str]:
    header, rows = _penguins()
    length, depth = header.index("bill_length_mm"), header.index("bill_depth_mm")
    rows[10][length] = "nan"
    rows[200][depth] = "inf"
    path = folder / "penguins.csv"
    path.write_text(_csv_text(header, rows))
    return ["--data", str(path)]


def _examples(count: int = 40) -> list[bytes]:
    header, rows = _penguins()
    records = []
    for row in rows[:count]:
        feature = {}
        for name, cell in zip(header, row, strict=True):
            if name in ("species", "island", "sex"):
                feature[name] = tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[cell.encode()])
                )
            else:
                value = float(cell) if cell != "NA" else 0.0
                feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
        records.append(
            tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
        )
    return records


def _tfrecord_bytes(records: list[bytes], compression: str = "") -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/data.tfrecord"
        with tf.io.TFRecordWriter(path, options=compression or None) as writer:
            for record in records:
                writer.write(record)
        return Path(path).read_bytes()


def _truncated_tfrecord(folder: Path) -> list[str]:
    data_dir = folder / "records"
    data_dir.mkdir()
    data = _tfrecord_bytes(_examples())
    (data_dir / "part-0.tfrecord").write_bytes(data[: len(data) - 37])  # cut inside the last record
    return ["--data", str(data_dir), "--set", "data.format=tfrecord"]


def _corrupted_gzip_tfrecord(folder: Path) -> list[str]:
    data_dir = folder / "records"
    data_dir.mkdir()
    data = bytearray(_tfrecord_bytes(_examples(), compression="GZIP"))
    assert data[:2] == b"\x1f\x8b"
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
    (data_dir / "part-0.tfrecord.gz").write_bytes(bytes(data))
    return ["--data", str(data_dir), "--set", "data.format=tfrecord"]


def _edited(edit: Callable[[int, dict[str, str]], None]) -> Callable[[Path], list[str]]:
    """Penguins with `edit(row_number, row)` applied to every row (a dict by column)."""

    def build(folder: Path) -> list[str]:
        header, rows = _penguins()
        edited = []
        for number, row in enumerate(rows):
            cells = dict(zip(header, row, strict=True))
            edit(number, cells)
            edited.append(list(cells.values()))
        path = folder / "penguins.csv"
        path.write_text(_csv_text(list(cells), edited))
        return ["--data", str(path)]

    return build


def _decimal_commas(number: int, row: dict[str, str]) -> None:
    if number % 40 == 5:
        row["bill_length_mm"] = row["bill_length_mm"].replace(".", ",")


def _trailing_space_labels(number: int, row: dict[str, str]) -> None:
    if number in (5, 45, 85):
        row["species"] += " "


def _missing_schema_file(folder: Path) -> list[str]:
    return ["--set", f"data.schema_path={folder / 'nope.pbtxt'}"]


HEADER_LINE = "species,island,bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g,sex,year"


@dataclass(frozen=True)
class Case:
    case_id: str
    stage: str  # "before" (fullthrottle.core.staging, no component runs) or "gate" (DataGate fails)
    build: Callable[[Path], list[str]]  # writes the input under a folder, returns CLI args
    needles: tuple[str, ...]  # what the one-paragraph message must say


CASES = (
    Case(
        "missing-column",
        "before",
        _write(
            "penguins.csv",
            _penguin_text(lambda h, rows: (h[:3] + h[4:], [r[:3] + r[4:] for r in rows])),
        ),
        ("'bill_depth_mm'", "data.numeric", "penguins.csv"),
    ),
    Case(
        "missing-label-column",
        "before",
        _write("penguins.csv", _penguin_text(lambda h, rows: (h[1:], [r[1:] for r in rows]))),
        ("'species'", "data.label"),
    ),
    Case(
        "string-in-numeric-column",
        "before",
        _with_cells("body_mass_g", "heavy"),
        ("column 'body_mass_g'", "'heavy' is not a number", "line 7"),
    ),
    Case("empty-file", "before", _write("penguins.csv", ""), ("penguins.csv is empty",)),
    Case("header-only", "before", _write("penguins.csv", HEADER_LINE + "\n"), ("no rows of data",)),
    Case(
        "single-label-value",
        "before",
        _write(
            "penguins.csv",
            _penguin_text(lambda h, rows: (h, [r for r in rows if r[0] == "Gentoo"])),
        ),
        ("single value 'Gentoo'", "at least two classes", "data.label"),
    ),
    Case(
        "duplicated-header-row",
        "before",
        _write(
            "penguins.csv",
            _penguin_text(lambda h, rows: (h, rows[:100] + [list(h)] + rows[100:])),
        ),
        ("line 102", "header line appears again"),
    ),
    Case(
        "non-utf8-bytes",
        "before",
        _write(
            "penguins.csv",
            _penguin_text(lambda h, rows: (h, rows))
            .encode()
            .replace(b"Torgersen", b"Torg\xe9rsen", 1),
        ),
        ("not UTF-8", "line 2"),
    ),
    Case(
        "wrong-delimiter",
        "before",
        _write("penguins.csv", _penguin_text(lambda h, rows: (h, rows)).replace(",", ";")),
        ("single column", "delimiter"),
    ),
    Case(
        "value-over-csv-field-limit",
        "before",
        _with_cells("island", "Biscoe" * 30_000, every=1000),
        ("line 7", "field larger than field limit", "Shorten or remove"),
    ),
    Case(
        "truncated-tfrecord",
        "before",
        _truncated_tfrecord,
        ("part-0.tfrecord", "damaged TFRecord", "truncated or corrupted"),
    ),
    Case(
        "corrupted-gzip-tfrecord",
        "before",
        _corrupted_gzip_tfrecord,
        ("part-0.tfrecord.gz", "gzip", "corrupted"),
    ),
    Case(
        "missing-schema-file",
        "before",
        _missing_schema_file,
        ("nope.pbtxt", "data.schema_path", "fullthrottle schema"),
    ),
    Case(
        "decimal-comma-in-numeric-column",
        "before",
        _edited(_decimal_commas),
        ("column 'bill_length_mm'", "'39,3' has a decimal comma (line 7)", "data.decimal: ','"),
    ),
    Case(
        "near-duplicate-labels",
        "before",
        _edited(_trailing_space_labels),
        (
            "column 'species'",
            "'Adelie ' (3 rows: line 7, line 47, line 87)",
            "data.near_duplicate_labels: merge",
        ),
    ),
    Case(
        "comma-in-column-name",
        "before",
        _write(
            "penguins.csv",
            _penguin_text(lambda h, rows: ([*h[:5], "body mass, g", *h[6:]], rows)),
            "--set",
            'data.numeric=["bill_length_mm", "body mass, g"]',
        ),
        ("'body mass, g', holds a comma", "CsvExampleGen"),
    ),
    Case(
        "extra-column",
        "gate",
        _extra_column,
        ("column 'wingspan_mm'", "SCHEMA_NEW_COLUMN", "New column"),
    ),
    Case(
        "label-missing-in-some-rows",
        "gate",
        _with_cells("species", "NA"),
        ("column 'species'",),
    ),
    Case(
        "unseen-label-value",
        "gate",
        _with_cells("species", "Emperor"),
        ("column 'species'", "ENUM_TYPE_UNEXPECTED_STRING_VALUES", "Emperor"),
    ),
    Case(
        "nan-and-inf",
        "gate",
        _nan_and_inf,
        ("column 'bill_length_mm'", "FLOAT_TYPE_HAS_NAN", "column 'bill_depth_mm'", "Inf"),
    ),
    Case(
        "far-out-of-range",
        "gate",
        _with_cells("body_mass_g", "45000"),
        ("column 'body_mass_g'", "FLOAT_TYPE_BIG_FLOAT", "45000"),
    ),
    Case(
        "extremely-long-value",
        "gate",
        _with_cells("island", "Dream" * 20_000, every=1000),
        ("column 'island'", "ENUM_TYPE_UNEXPECTED_STRING_VALUES", "characters)"),
    ),
)


def _run(capsys, folder: Path, case: Case) -> tuple[int, str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    args = case.build(folder)
    output_dir = folder / "out"
    if case.stage == "gate":
        # The curated schema is the contract; user data only gets it when asked for.
        args = [*args, "--set", f"data.schema_path={PENGUINS_SCHEMA}"]
    capsys.readouterr()
    code = cli.main(
        ["run", "--output-dir", str(output_dir), "--set", "training.train_steps=5", *args]
    )
    stderr = capsys.readouterr().err
    return code, stderr, output_dir


def _error_paragraph(stderr: str) -> str:
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("fullthrottle run: error:")]
    assert starts, f"no error message in:\n{stderr[-3000:]}"
    return " ".join(lines[starts[-1] :])


def _assert_nothing_pushed(output_dir: Path) -> None:
    assert served_dirs(output_dir / "serving" / "penguins") == []


@pytest.mark.parametrize("case", [c for c in CASES if c.stage == "before"], ids=lambda c: c.case_id)
def test_stopped_before_the_pipeline(tmp_path, capsys, case):
    code, stderr, output_dir = _run(capsys, tmp_path, case)
    assert code == 2, stderr[-3000:]
    message = _error_paragraph(stderr)
    assert "Traceback" not in stderr
    for needle in case.needles:
        assert needle in message, (needle, message)
    _assert_nothing_pushed(output_dir)
    assert not (output_dir / "metadata").exists(), (
        "no component may run on data stopped before the pipeline"
    )


# The gate case run end to end (the real pipeline: ArrowExampleGen -> StatisticsGen ->
# ExampleValidator -> DataGate on Beam, MLflow, last_run.json); every gate case, this one
# included, is also checked in-process below.
END_TO_END = "extra-column"


def _gate_message(folder: Path, case: Case) -> str:
    """What the DataGate would say of `case`, in this process: the data staged as `run` stages
    it, TFDV's statistics of it and ExampleValidator's validation against the curated schema,
    the gate's cell checks, and its report."""
    import tensorflow_data_validation as tfdv

    from components.data_gate import anomalies_of_split, data_findings, describe_inputs
    from fullthrottle.core.config import load_config
    from fullthrottle.core.staging import STAGED_CSV, prepare_data

    folder.mkdir(parents=True, exist_ok=True)
    args = case.build(folder)
    overrides = [f"output_dir={folder / 'out'}", f"data.schema_path={PENGUINS_SCHEMA}"]
    for flag, value in zip(args[::2], args[1::2], strict=True):
        overrides.append(f"data.path={value}" if flag == "--data" else value)
    config = load_config(overrides=overrides)
    prepared = prepare_data(config)
    # The same CSV decoder, with the same type inference, as CsvExampleGen (both splits).
    statistics = tfdv.generate_statistics_from_csv(f"{prepared.input_base}/*/{STAGED_CSV}")
    schema = tfdv.load_schema_text(str(PENGUINS_SCHEMA))
    found = anomalies_of_split(
        "all", tfdv.validate_statistics(statistics=statistics, schema=schema)
    )
    types = {f.name: schema_pb2.FeatureType.Name(f.type) for f in schema.feature}
    findings = data_findings(config.data, input_base=prepared.input_base, schema_types=types)
    assert found or findings, f"{case.case_id}: the gate would let this data through"
    return format_report(
        found,
        input_files=describe_inputs(config.data, prepared.input_base),
        schema_source=str(PENGUINS_SCHEMA),
        findings=findings,
    )


@pytest.mark.parametrize("case", [c for c in CASES if c.stage == "gate"], ids=lambda c: c.case_id)
def test_stopped_by_the_data_gate(tmp_path, case):
    message = _gate_message(tmp_path, case)
    assert message.startswith("the data gate stopped the run")
    for needle in (*case.needles, "penguins.csv", str(PENGUINS_SCHEMA)):
        assert needle in message, (needle, message)
    assert "Transform and Trainer did not run" in message
    assert len(message) < 6000, "long cell values must be clipped in the report"


@pytest.mark.slow
def test_a_gate_case_end_to_end_stops_before_transform(tmp_path, capsys):
    (case,) = [c for c in CASES if c.case_id == END_TO_END]
    code, stderr, output_dir = _run(capsys, tmp_path, case)
    assert code == 2, stderr[-3000:]
    message = _error_paragraph(stderr)
    assert message.startswith(
        "fullthrottle run: error: DataGate failed: the data gate stopped the run"
    )
    for needle in (
        *case.needles,
        "penguins.csv",
        str(PENGUINS_SCHEMA),
        "Transform and Trainer did not run",
    ):
        assert needle in message, (needle, message)
    _assert_nothing_pushed(output_dir)
    outcome = read_latest_run(str(output_dir / "metadata" / "fullthrottle-penguins.sqlite"))
    assert outcome is not None
    assert outcome.components["DataGate"].state == "failed"
    assert outcome.components["ExampleValidator"].state == "complete"
    assert not {"Transform", "Trainer", "Evaluator", "Pusher"} & set(outcome.components)
    last = json.loads((output_dir / "last_run.json").read_text())
    assert last["status"] == "failed" and last["failed_component"] == "DataGate"
    assert last["pushed_model_dir"] is None
    assert "data gate stopped the run" in last["error"]
    # A secret in the config does not reach last_run.json.
    assert SECRET not in (output_dir / "last_run.json").read_text()
    assert last["config"]["beam"]["extra_args"] == ["--db_password=REDACTED"]
    _assert_mlflow_run_failed_with_the_reason(output_dir)


def _assert_mlflow_run_failed_with_the_reason(output_dir: Path) -> None:
    """The run's (embedded, default) MLflow store has one parent run, FAILED, with the reason."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{output_dir / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("fullthrottle-penguins")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, [r.info.run_id for r in runs]
    assert parents[0].info.status == "FAILED"
    assert "data gate stopped the run" in parents[0].data.tags["fullthrottle.failure_reason"]


def _doc_table() -> dict[str, str]:
    """case id -> stage, from the corpus table in docs/reliability.md."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Bad-input corpus", 1)[1].split("\n## ", 1)[0]
    table: dict[str, str] = {}
    for line in section.splitlines():
        match = re.match(r"\|\s*`([a-z0-9-]+)`\s*\|([^|]*)\|\s*(before|gate)\b", line)
        if match:
            assert match.group(1) not in table, f"case {match.group(1)} listed twice in {DOC}"
            table[match.group(1)] = match.group(3)
    return table


def test_docs_table_matches_the_corpus():
    assert _doc_table() == {c.case_id: c.stage for c in CASES}
    assert len(CASES) >= 15


def test_corpus_covers_the_issue_list():
    required = {
        "missing-column", "extra-column", "string-in-numeric-column", "empty-file", "header-only",
        "label-missing-in-some-rows", "unseen-label-value", "nan-and-inf", "far-out-of-range",
        "single-label-value", "duplicated-header-row", "non-utf8-bytes", "truncated-tfrecord",
        "corrupted-gzip-tfrecord", "extremely-long-value", "wrong-delimiter",
    }  # fmt: skip
    assert required <= {c.case_id for c in CASES}
