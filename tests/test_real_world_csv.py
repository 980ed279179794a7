"""A real-world CSV, as a new user brings it: awkward column names, dirty cells.

The session's own-data run (tests/own_data.py) holds the column-name cases (slashes, spaces,
parentheses, dots, leading digits, CJK and accented letters, names that differ only in case,
Python keywords, a 200-character name, names that read alike once sanitized, a column called
"label") plus decimal commas in a numeric column and labels written several ways. The user's
path, once: `init` reports the dirty cells; `run` on init's config stops in its first seconds;
with the suggested options one pipeline run trains and pushes; the pushed model answers
`predict_raw`, the REST API and `fullthrottle predict` under the names as written, and MLflow's
params keep them. Names no column can have stop `run` before any component runs; dirty TFRecord
input, which staging cannot read cell by cell, is stopped by the DataGate before Transform.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
import tensorflow_transform as tft

from fullthrottle.core.config import load_config
from fullthrottle.core.features import LABEL_VOCAB, internal_name, transformed_name
from fullthrottle.outcome import read_latest_run
from fullthrottle.tracking.store import scoped_tracking_uri
from serving.servables import read_signature_defs
from serving.signatures import call_signature, signature_input_specs
from tests.helpers import last_run, run_cli, served_dirs
from tests.own_data import (
    CONSTANT,
    DECIMAL_COMMA_ROWS,
    ID,
    LABEL,
    LABEL_CASE_ROWS,
    LABEL_SPACE_ROWS,
    NAMES,
    SUGGESTED,
    TRAIN_STEPS,
    OwnDataRun,
    cli_in_process,
    complete,
    line_of,
    own_data_run,
    penguin_rows,
)


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> OwnDataRun:
    """The user's path: write the CSV, init, run (stopped), run with the suggested options."""
    return own_data_run(tmp_path_factory)


# --- init and the first run: reported, then stopped -------------------------------------------
@pytest.mark.slow
def test_init_reports_the_dirty_cells_with_values_lines_and_the_fix(user):
    code, said = user.init
    assert code == 0, said
    number = DECIMAL_COMMA_ROWS[0]
    comma = user.records[number]["bill length (mm)"]
    assert "," in comma
    assert "column 'bill length (mm)' (in `data.numeric`): 4 of 342 present cells" in said
    assert f"{comma!r} has a decimal comma ({line_of(number)})" in said
    assert "Set `data.decimal: ','`" in said
    space, case = LABEL_SPACE_ROWS, LABEL_CASE_ROWS
    assert f"'Adelie ' (3 rows: {', '.join(line_of(n) for n in space)})" in said
    assert f"'gentoo' (2 rows: {', '.join(line_of(n) for n in case)})" in said
    assert "`data.near_duplicate_labels: merge`" in said and "`keep`" in said
    # The written config keeps every name as written, lists the dirty column as numeric (what it
    # is meant to be) and carries the same notes at its top.
    config = load_config(user.config_path)
    assert set(config.data.feature_columns) | {config.data.label} == set(NAMES) - {ID, CONSTANT}
    assert "bill length (mm)" in config.data.numeric
    text = user.config_path.read_text(encoding="utf-8")
    assert text.index("# NEEDS A DECISION") < text.index("data:")
    assert "near_duplicate_labels: stop" in text and 'decimal: "."' in text


@pytest.mark.slow
def test_run_on_the_unedited_config_stops_in_staging_naming_both(user):
    code, said = user.stopped
    assert code == 2, said
    assert said.startswith(f"fullthrottle run: error: {user.csv_path}: 2 columns need a decision")
    assert "column 'bill length (mm)' (in `data.numeric`)" in said
    assert f"column {LABEL!r} (in `data.label`)" in said
    assert "Traceback" not in said
    # Before any component: no metadata store, nothing staged for ExampleGen.
    assert not (user.stopped_dir / "metadata").exists()
    assert not (user.stopped_dir / "data").exists()
    print(f"stopped by staging after {user.stopped_seconds:.1f} s (imports included)")


# --- with the suggested options: trained, pushed, served under the names as written ---------
@pytest.mark.slow
def test_with_the_suggested_options_it_trains_and_pushes(user):
    result = user.run
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-5000:]}"
    last = last_run(user.output_dir)
    assert last["blessed"] and last["pushed_model_dir"], last
    assert last["training"]["steps_completed"] == TRAIN_STEPS
    # The label's spellings were merged into three classes, not five.
    graphs = list(Path(last["pipeline_root"]).glob("Transform/transform_graph/*"))
    assert len(graphs) == 1, graphs
    classes = tft.TFTransformOutput(str(graphs[0])).vocabulary_by_name(LABEL_VOCAB)
    assert sorted(c.decode() for c in classes) == ["Adelie", "Chinstrap", "Gentoo"]


@pytest.mark.slow
def test_the_model_takes_every_column_under_the_name_as_written(user):
    last = last_run(user.output_dir)
    config = load_config(user.config_path)
    features = set(config.data.feature_columns)
    # What TF Serving and `fullthrottle serve` match request keys against.
    signature_defs = read_signature_defs(last["pushed_model_dir"])
    assert set(signature_defs["predict_raw"].inputs) == features
    model = tf.saved_model.load(last["pushed_model_dir"])
    specs = signature_input_specs(model, "predict_raw")
    assert set(specs) == features
    # TensorFlow's own calling convention keeps the internal names (see serving/signatures.py).
    internal = set(model.signatures["predict_raw"].structured_input_signature[1])
    assert internal == {internal_name(name) for name in features}
    # Raw rows under the names as written give what serialized examples give.
    written = [r for r in user.records[::7] if complete(r)]
    inputs = {
        name: np.array(
            [
                r[name] if spec.dtype == tf.string else float(r[name].replace(",", "."))
                for r in written
            ],
            dtype=object if spec.dtype == tf.string else spec.dtype.as_numpy_dtype,
        )
        for name, spec in specs.items()
    }
    raw = call_signature(model, "predict_raw", {k: tf.constant(v) for k, v in inputs.items()})
    examples = [_example(r, specs) for r in written]
    served = model.signatures["serving_default"](examples=tf.constant(examples))
    np.testing.assert_allclose(
        raw["probabilities"].numpy(), served["probabilities"].numpy(), atol=1e-5
    )
    accuracy = np.mean(
        [
            c.decode() == r[LABEL].strip().capitalize()
            for c, r in zip(raw["classes"].numpy(), written, strict=True)
        ]
    )
    assert accuracy > 0.9, accuracy
    # Transform's outputs (and the model's inputs) use the internal names.
    transformed = set(model.signatures["predict_transformed"].structured_input_signature[1])
    assert transformed == {transformed_name(name) for name in features}


@pytest.mark.slow
def test_mlflow_params_keep_the_names_as_written(user):
    from mlflow.tracking import MlflowClient

    output_dir = user.output_dir
    client = MlflowClient(tracking_uri=f"sqlite:///{output_dir / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(load_config(user.config_path).pipeline_name)
    runs = client.search_runs([experiment.experiment_id])
    params = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags).data.params
    assert params["data.label"] == LABEL
    numeric = load_config(user.config_path).data.numeric
    assert json.loads(params["data.numeric"]) == list(numeric)
    assert "温度" in params["data.numeric"] and "Körpermasse (g)" in params["data.numeric"]


@pytest.mark.slow
def test_the_mlflow_model_takes_the_columns_as_written(user):
    import mlflow

    last = last_run(user.output_dir)
    model_id = last["tracking"]["model_id"]
    assert model_id, last["tracking"]
    with scoped_tracking_uri(f"sqlite:///{user.output_dir / 'mlflow' / 'mlflow.db'}"):
        model = mlflow.pyfunc.load_model(f"models:/{model_id}")
    features = set(load_config(user.config_path).data.feature_columns)
    schema = model.metadata.get_input_schema()
    assert set(schema.input_names()) == features
    # Numbers are typed "any" (pandas' int64 and float64 alike), listed as numeric_columns.
    numeric = set(model.metadata.metadata["numeric_columns"])
    assert numeric == set(load_config(user.config_path).data.numeric)
    kinds = {c.name: "number" if c.name in numeric else c.type.name for c in schema.inputs}
    cast = {"string": str, "long": int, "number": lambda cell: float(cell.replace(",", "."))}
    written = [r for r in user.records[::7] if complete(r)][:5]
    rows = pd.DataFrame([{name: cast[kinds[name]](r[name]) for name in features} for r in written])
    predicted = model.predict(rows)
    assert [c for c in predicted["class"]] == [r[LABEL].strip().capitalize() for r in written]


@pytest.mark.slow
def test_rest_and_predict_take_the_names_as_written(user):
    from fullthrottle.bench.serving import free_port, start_server, stop_server

    last = last_run(user.output_dir)
    config = load_config(user.config_path)
    serving_dir = Path(last["pushed_model_dir"]).parent
    port = free_port()
    process = start_server(str(serving_dir), model_name=config.model_name, port=port)
    try:
        base = f"http://127.0.0.1:{port}"
        with urllib_open(f"{base}/v1/models/{config.model_name}/metadata") as response:
            metadata = json.loads(response.read())
        inputs = metadata["metadata"]["signature_def"]["signature_def"]["predict_raw"]["inputs"]
        assert set(inputs) == set(config.data.feature_columns)
        # A few rows of the user's own file, decimal commas included, as `predict` reads them.
        rows_file = user.workdir / "new_rows.csv"
        with user.csv_path.open(encoding="utf-8") as source:
            lines = source.read().splitlines()
        picked = [1 + DECIMAL_COMMA_ROWS[0], 2, 160, 300]  # lines of Adelie, Gentoo, Chinstrap
        assert all(complete(user.records[i - 1]) for i in picked)
        rows_file.write_text("\n".join([lines[0], *(lines[i] for i in picked)]) + "\n")
        # In this process (its imports are paid): `predict` as a user runs it, over REST.
        printed: list[str] = []
        code, said = cli_in_process(
            "predict",
            "--config",
            str(user.config_path),
            "--csv",
            str(rows_file),
            "--url",
            base,
            "--output",
            "json",
            *SUGGESTED,
            stdout=printed,
        )
        assert code == 0, said
        answered = json.loads(printed[0])
        truth = [next(csv.reader([lines[i]]))[0].strip().capitalize() for i in picked]
        assert [a["classes"] for a in answered] == truth
        # JSON instances keyed by the names as written (predict_raw through REST).
        records = [user.records[i - 1] for i in picked]
        instances = [
            {
                name: record[name]
                if tensor["dtype"] == "DT_STRING"
                else (
                    int(record[name])
                    if tensor["dtype"] == "DT_INT64"
                    else float(record[name].replace(",", "."))
                )
                for name, tensor in inputs.items()
            }
            for record in records
        ]
        body = json.dumps({"signature_name": "predict_raw", "instances": instances}).encode()
        with urllib_open(f"{base}/v1/models/{config.model_name}:predict", body) as response:
            predictions = json.loads(response.read())["predictions"]
        assert [p["classes"] for p in predictions] == truth
        np.testing.assert_allclose(
            [p["probabilities"] for p in predictions],
            [a["probabilities"] for a in answered],
            atol=1e-5,
        )
    finally:
        output = stop_server(process)
    assert "Traceback" not in output, output[-3000:]


def urllib_open(url: str, body: bytes | None = None):
    import urllib.request

    request = urllib.request.Request(
        url,
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST" if body else "GET",
    )
    return urllib.request.urlopen(request, timeout=60)


def _example(record: dict[str, str], specs: dict) -> bytes:
    feature = {}
    for name, spec in specs.items():
        cell = record[name]
        if spec.dtype == tf.string:
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[cell.encode()]))
        elif spec.dtype.is_integer:
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(cell)]))
        else:
            value = float(cell.replace(",", "."))
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


# --- names no column can have: stopped before any component ---------------------------------
def _with_header(folder: Path, header: list[str]) -> Path:
    """The penguins with `header` as the header line (quoted by the CSV writer as needed)."""
    rows = penguin_rows()
    path = folder / "renamed.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows([list(r.values()) for r in rows])
    return path


PENGUIN_COLUMNS = list(penguin_rows()[0])
BAD_NAMES = {
    # A comma in a name: CsvExampleGen splits the header line at every comma.
    "comma": (
        {"body_mass_g": "body mass, g"},
        ("column 6 of the header, 'body mass, g', holds a comma", "CsvExampleGen", "Rename"),
    ),
    "line-break": (
        {"body_mass_g": "body mass\ng"},
        ("'body mass\\ng', holds a line break",),
    ),
    "duplicate-once-trimmed": (
        {"year": "sex "},
        ("columns 7 ('sex') and 8 ('sex ')", "same name once surrounding whitespace is removed"),
    ),
    # Two names that would share one internal name: refused naming both, before any component.
    "internal-name-collision": (
        {"year": internal_name("bill length (mm)"), "bill_length_mm": "bill length (mm)"},
        ("'bill length (mm)' (in `data.numeric`)", "would both be called", "Rename one"),
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_NAMES))
def test_a_bad_column_name_stops_run_before_any_component(tmp_path, case):
    renames, needles = BAD_NAMES[case]
    header = [renames.get(name, name) for name in PENGUIN_COLUMNS]
    data = _with_header(tmp_path, header)
    numeric = [renames.get(n, n) for n in ("bill_length_mm", "bill_depth_mm", "body_mass_g")]
    if case == "internal-name-collision":
        numeric.append(renames["year"])
    output_dir = tmp_path / "out"
    started = time.monotonic()
    code, said = cli_in_process(
        "run",
        "--data",
        str(data),
        "--output-dir",
        str(output_dir),
        "--set",
        f"data.numeric={json.dumps(numeric)}",
    )
    seconds = time.monotonic() - started
    assert code == 2, said
    for needle in needles:
        assert needle in said, (needle, said)
    assert "Traceback" not in said
    # Stopped before the pipeline was built: no component ran, so Transform never started.
    assert not (output_dir / "metadata").exists()
    assert served_dirs(output_dir / "serving" / "penguins") == []
    print(f"{case}: stopped after {seconds:.2f} s")


# --- dirty TFRecord input: stopped by the DataGate, before Transform ----------------------------
@pytest.mark.slow
def test_dirty_tfrecords_are_stopped_by_the_gate_before_transform(tmp_path):
    """Staging counts TFRecords but cannot read them cell by cell: the gate does, every run."""
    folder = tmp_path / "records"
    folder.mkdir()
    rows = [r for r in penguin_rows() if "NA" not in r.values()]
    with tf.io.TFRecordWriter(str(folder / "part-0.tfrecord.gz"), options="GZIP") as writer:
        for number, row in enumerate(rows):
            mass = row["body_mass_g"] + (",5" if number in (11, 99) else "")  # text throughout
            species = row["species"] + (" " if number in (4, 50) else "")
            feature = {
                "species": _bytes(species),
                "island": _bytes(row["island"]),
                "sex": _bytes(row["sex"]),
                "body_mass_g": _bytes(mass),
                **{
                    name: tf.train.Feature(float_list=tf.train.FloatList(value=[float(row[name])]))
                    for name in ("bill_length_mm", "bill_depth_mm", "flipper_length_mm")
                },
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            # Deterministic: the same bytes in every process, so ExampleGen's hash split (which
            # puts every record where its bytes' hash says) is the same in every run.
            writer.write(example.SerializeToString(deterministic=True))
    output_dir = tmp_path / "out"
    code, said = cli_in_process(
        "run",
        "--data",
        str(folder),
        "--output-dir",
        str(output_dir),
        "--set",
        "data.format=tfrecord",
        "--set",
        "training.train_steps=5",
    )
    assert code == 2, said[-3000:]
    assert "DataGate failed: the data gate stopped the run" in said, said[-3000:]
    for needle in (
        "column 'body_mass_g' (in `data.numeric`)",
        f"'{rows[11]['body_mass_g']},5' has a decimal comma (part-0.tfrecord.gz record 12)",
        "column 'species' (in `data.label`)",
        "'Adelie ' (2 rows: part-0.tfrecord.gz record 5, part-0.tfrecord.gz record 51)",
        "Transform and Trainer did not run",
    ):
        assert needle in said, (needle, said[-3000:])
    assert "Traceback" not in said
    outcome = read_latest_run(str(output_dir / "metadata" / "fullthrottle-penguins.sqlite"))
    assert outcome.components["DataGate"].state == "failed"
    assert not {"Transform", "Trainer", "Evaluator", "Pusher"} & set(outcome.components)
    assert served_dirs(output_dir / "serving" / "penguins") == []


def _bytes(text: str) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode()]))


def test_a_bad_column_name_fails_in_seconds_before_transform_starts(tmp_path):
    """As a user runs it (a fresh process, imports included): timed, and stopped before the
    pipeline was built, so before Transform could start."""
    header = ["body mass, g" if name == "body_mass_g" else name for name in PENGUIN_COLUMNS]
    data = _with_header(tmp_path, header)
    output_dir = tmp_path / "out"
    started = time.monotonic()
    result = run_cli(
        "run",
        "--data",
        str(data),
        "--output-dir",
        str(output_dir),
        "--set",
        'data.numeric=["bill_length_mm", "body mass, g"]',
    )
    seconds = time.monotonic() - started
    assert result.returncode == 2, result.stderr[-3000:]
    assert "'body mass, g', holds a comma" in " ".join(result.stderr.split())
    # No metadata store and no progress lines: no component ran, Transform never started.
    assert not (output_dir / "metadata").exists()
    assert "[pipeline]" not in result.stderr and "Transform" not in result.stderr
    print(f"a comma in a column name: `fullthrottle run` failed after {seconds:.1f} s")
