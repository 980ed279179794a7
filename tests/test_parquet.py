"""Parquet input, from the user's side: a file pandas wrote (missing values in an int, a float and
a string column; an int column holding zeros) -> `init` -> `run` -> a pushed model ->
`fullthrottle predict --parquet` answering what the served model answers.

One real pipeline run for the module (the pipeline's ArrowExampleGen reading the staged Parquet).
Everything else -- a folder of two files, the staged files and their cache behaviour, the
data gate's cell reader, and each kind of bad Parquet -- is checked without a pipeline, in
process or through the CLI, which must stop with the one-paragraph message before any component.
"""

from __future__ import annotations

import dataclasses
import decimal
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
import yaml

from components.arrow_example_gen import encode_parquet_file
from fullthrottle.bench.serving import free_port, start_server, stop_server
from fullthrottle.commands.schema import infer_schema_text
from fullthrottle.core.bundled import bundled_path
from fullthrottle.core.columns import infer_columns
from fullthrottle.core.config import BUNDLED_PENGUINS, Config, DataSpec, EvalConfig, load_config
from fullthrottle.core.errors import DataError
from fullthrottle.core.staging import STAGED_PARQUET, prepare_data, read_input_cells
from tests.helpers import last_run, run_cli

LABEL = "species"
TRAIN_STEPS = 200
INTS = ("flipper_length_mm", "body_mass_g", "study_year")
FLOATS = ("bill_length_mm", "bill_depth_mm")
STRINGS = ("island", "sex")


def penguins_frame() -> pd.DataFrame:
    """The bundled penguins with pandas' nullable integers (missing values in int columns) and
    `study_year` = year - 2007 (0, 1, 2: an int column holding zeros)."""
    frame = pd.read_csv(bundled_path(BUNDLED_PENGUINS))
    for column in ("flipper_length_mm", "body_mass_g"):
        frame[column] = frame[column].astype("Int64")
    frame["study_year"] = frame.pop("year") - 2007
    return frame


def spec_for(path: Path, **changes) -> DataSpec:
    fields = {
        "path": str(path),
        "format": "parquet",
        "label": LABEL,
        "numeric": (*FLOATS, *INTS),
        "categorical": STRINGS,
        **changes,
    }
    return DataSpec(**fields)


def stage(path: Path, output: Path, **changes):
    spec = spec_for(path, **changes)
    # A regression config needs its bar (staging does not read it).
    evaluation = EvalConfig(max_mae=1000.0) if spec.task == "regression" else EvalConfig()
    return prepare_data(Config(data=spec, output_dir=str(output), evaluation=evaluation))


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return penguins_frame()


@pytest.fixture(scope="module")
def parquet_file(tmp_path_factory, frame) -> Path:
    path = tmp_path_factory.mktemp("parquet") / "penguins.parquet"
    frame.to_parquet(path, index=False)
    return path


# --- the whole run ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def parquet_run(parquet_file):
    folder = parquet_file.parent
    config_path = folder / "penguins.yaml"
    init = run_cli(
        "init", "--data", str(parquet_file), "--label", LABEL, "--output", str(config_path)
    )  # fmt: skip
    assert init.returncode == 0, init.stdout + init.stderr
    output_dir = folder / "out"
    started = time.monotonic()
    run = run_cli(
        "run", "--config", str(config_path), "--output-dir", str(output_dir),
        "--set", f"training.train_steps={TRAIN_STEPS}",
    )  # fmt: skip
    seconds = time.monotonic() - started
    assert run.returncode == 0, f"run failed:\n{run.stdout}\n{run.stderr[-5000:]}"
    return SimpleNamespace(
        init=init,
        run=run,
        seconds=seconds,
        config_path=config_path,
        output_dir=output_dir,
        last=last_run(output_dir),
    )


@pytest.mark.slow
def test_init_types_the_columns_by_the_parquet_schema(parquet_run):
    config = load_config(parquet_run.config_path)
    assert config.data.format == "parquet"
    assert config.data.label == LABEL and config.data.task == "classification"
    # Int (with and without missing values) and float columns are numbers, strings categories.
    assert set(config.data.numeric) == {*FLOATS, *INTS}
    assert set(config.data.categorical) == set(STRINGS)
    assert config.data.na_values == ()
    text = parquet_run.config_path.read_text()
    assert '- "body_mass_g"   # every present cell is a number (2700 .. 6300); 2 missing' in text
    assert '- "sex"   # 2 distinct values: ' in text and "; 11 missing" in text


def _examples(last: dict) -> dict[str, list[tf.train.Example]]:
    root = Path(last["pipeline_root"]) / "ArrowExampleGen" / "examples"
    return {
        split: [
            tf.train.Example.FromString(record.numpy())
            for record in tf.data.TFRecordDataset(
                sorted(str(p) for p in root.glob(f"*/Split-{split}/*")), compression_type="GZIP"
            )
        ]
        for split in ("train", "eval")
    }


@pytest.mark.slow
def test_run_pushes_a_model_from_examples_typed_by_the_parquet_schema(parquet_run, frame):
    last = parquet_run.last
    assert last["blessed"] is True and last["pushed_model_dir"], last
    splits = _examples(last)
    # 344 rows, 3 : 1 stratified by species, as CSV input is split.
    assert (len(splits["train"]), len(splits["eval"])) == (258, 86)
    examples = splits["train"] + splits["eval"]
    wanted = {
        **{name: "int64_list" for name in INTS},
        **{name: "float_list" for name in FLOATS},
        **{name: "bytes_list" for name in STRINGS},
    }
    for name, kind in wanted.items():
        features = [e.features.feature[name] for e in examples]
        # The Parquet type; a missing value a feature without values, as CsvExampleGen leaves an
        # empty cell (`int64_list {}`).
        assert {f.WhichOneof("kind") for f in features} == {kind}, name
        counts = [len(getattr(f, kind).value) for f in features]
        assert set(counts) <= {0, 1}, (name, set(counts))
        assert counts.count(0) == int(frame[name].isna().sum()), name
    # A zero is a value, not a missing one (staged values are one-element lists, a null list
    # is missing).
    years = [list(e.features.feature["study_year"].int64_list.value) for e in examples]
    assert years.count([0]) == int((frame["study_year"] == 0).sum()) > 0


@pytest.mark.slow
def test_predict_on_the_parquet_file_answers_what_the_served_model_answers(
    parquet_run, parquet_file, frame, tmp_path
):
    last = parquet_run.last
    model = tf.saved_model.load(last["pushed_model_dir"])
    # The expected answers: the pushed SavedModel on tf.Examples built here from the frame.
    examples = []
    for row in frame.drop(columns=[LABEL]).itertuples(index=False):
        features = {}
        for name, value in zip(frame.drop(columns=[LABEL]).columns, row, strict=True):
            if pd.isna(value):
                continue
            if name in INTS:
                features[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
            elif name in FLOATS:
                features[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
            else:
                features[name] = tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[value.encode()])
                )
        examples.append(
            tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
        )
    expected = model.signatures["serving_default"](examples=tf.constant(examples))
    expected_probabilities = expected["probabilities"].numpy()
    accuracy = float(
        np.mean(
            np.array([c.decode() for c in expected["classes"].numpy()]) == frame[LABEL].to_numpy()
        )
    )
    assert accuracy > 0.9, accuracy

    config_file = tmp_path / "serve.yaml"
    config_file.write_text(yaml.safe_dump({"tracking": {"enabled": False}}))
    port, grpc_port = free_port(), free_port()
    process = start_server(
        str(Path(last["pushed_model_dir"]).parent), model_name=last["model_name"], port=port,
        grpc_port=grpc_port, config_file=str(config_file),
    )  # fmt: skip
    try:
        predicted = run_cli(
            "predict", "--config", str(parquet_run.config_path), "--parquet", str(parquet_file),
            "--url", f"http://127.0.0.1:{port}", "--output", "json",
        )  # fmt: skip
        assert predicted.returncode == 0, predicted.stdout + predicted.stderr
        rows = json.loads(predicted.stdout)
        assert len(rows) == len(frame)
        np.testing.assert_allclose(
            [row["probabilities"] for row in rows], expected_probabilities, rtol=1e-5, atol=1e-6
        )
        assert [row["classes"] for row in rows] == [c.decode() for c in expected["classes"].numpy()]
    finally:
        output = stop_server(process)
    assert "Traceback" not in output, output[-3000:]


# --- staging, without a pipeline ---------------------------------------------------------------
def test_a_folder_of_two_files_stages_as_the_one_file_does(parquet_file, frame, tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    frame.iloc[:200].to_parquet(folder / "part-0.parquet", index=False)
    frame.iloc[200:].to_parquet(folder / "part-1.parquet", index=False)
    (folder / "_SUCCESS").write_text("")  # Spark's marker is not data
    one = stage(parquet_file, tmp_path / "one")
    two = stage(folder, tmp_path / "two")
    assert two.rows == one.rows == 344
    assert len(two.source_files) == 2
    assert two.split == one.split
    # The same rows, split the same way (by content, not by file): the same staged bytes.
    for split in ("train", "eval"):
        assert (Path(two.input_base) / split / STAGED_PARQUET).read_bytes() == (
            Path(one.input_base) / split / STAGED_PARQUET
        ).read_bytes()
    inference = infer_columns(folder, label=LABEL)
    assert inference.format == "parquet" and inference.rows_sampled == 344
    assert set(inference.numeric) == {*FLOATS, *INTS}


def test_staged_files_are_typed_split_and_left_untouched_when_unchanged(
    parquet_file, frame, tmp_path
):
    prepared = stage(parquet_file, tmp_path / "out")
    train = Path(prepared.input_base) / "train" / STAGED_PARQUET
    evaluation = Path(prepared.input_base) / "eval" / STAGED_PARQUET
    assert prepared.split.rows("train") == 258 and prepared.split.rows("eval") == 86
    assert not prepared.split.not_evaluated and not prepared.split.not_trained
    schema = pq.read_schema(train)
    assert schema.field("body_mass_g").type == pa.list_(pa.int64())
    assert schema.field("bill_length_mm").type == pa.list_(pa.float64())
    assert schema.field("sex").type == pa.list_(pa.string())
    # What the pipeline's ExampleGen makes of them, row by row: a zero stays a value, a null
    # list is a feature without values (missing, as an empty CSV cell).
    rows = pq.read_table(train).to_pylist()
    examples = [
        tf.train.Example.FromString(record).features.feature
        for batch in encode_parquet_file(str(train))
        for record in batch
    ]
    assert len(examples) == len(rows)
    zero_rows = [i for i, row in enumerate(rows) if row["study_year"] == [0]]
    assert zero_rows and all(
        list(examples[i]["study_year"].int64_list.value) == [0] for i in zero_rows
    )
    missing = [i for i, row in enumerate(rows) if row["sex"] is None]
    assert missing and all(not examples[i]["sex"].bytes_list.value for i in missing)
    present = [i for i, row in enumerate(rows) if row["sex"] is not None]
    assert all(
        [v.decode() for v in examples[i]["sex"].bytes_list.value] == rows[i]["sex"] for i in present
    )
    # Unchanged input: the files keep their bytes and times (ExampleGen's cache holds).
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (train, evaluation)}
    stage(parquet_file, tmp_path / "out")
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (train, evaluation)} == before
    # A changed value rewrites the files.
    changed = frame.copy()
    changed.loc[0, "body_mass_g"] = 3751
    changed_path = tmp_path / "changed.parquet"
    changed.to_parquet(changed_path, index=False)
    stage(changed_path, tmp_path / "out")
    assert {p: p.read_bytes() for p in (train, evaluation)} != {
        p: b for p, (b, _) in before.items()
    }
    # The data gate reads the staged cells back, with their places.
    cells = read_input_cells(
        prepared.input_base, data_format="parquet", columns=["body_mass_g", LABEL]
    )
    assert len(cells[LABEL]) == 344
    assert cells["body_mass_g"][0][0] == "train/data.parquet row 1"
    assert sum(1 for _, cell in cells["body_mass_g"] if cell == "") == 2


def test_rare_classes_and_regression_labels_split_as_csv_input_does(frame, tmp_path):
    rare = frame.copy()
    rare.loc[0, LABEL] = "Emperor"  # one row: trained on, never evaluated
    path = tmp_path / "rare.parquet"
    rare.to_parquet(path, index=False)
    prepared = stage(path, tmp_path / "rare")
    assert prepared.split.not_evaluated == {"Emperor": 1}
    numbers = frame.dropna(subset=["body_mass_g"]).drop(columns=[LABEL])
    regression_path = tmp_path / "mass.parquet"
    numbers.to_parquet(regression_path, index=False)
    regression = stage(
        regression_path,
        tmp_path / "mass",
        label="body_mass_g",
        task="regression",
        numeric=(*FLOATS, "flipper_length_mm", "study_year"),
    )
    assert regression.split.rows("train") + regression.split.rows("eval") == 342
    assert regression.split.rows("eval") == pytest.approx(342 / 4, abs=3)


def test_booleans_are_ints_and_dictionary_strings_are_strings(frame, tmp_path):
    typed = frame.copy()
    typed["heavy"] = (typed["body_mass_g"] > 4000).astype("boolean")
    typed["island"] = typed["island"].astype("category")
    path = tmp_path / "typed.parquet"
    typed.to_parquet(path, index=False)
    prepared = stage(path, tmp_path / "out", numeric=(*FLOATS, *INTS, "heavy"))
    table = pq.read_table(Path(prepared.input_base) / "train" / STAGED_PARQUET)
    assert table.schema.field("heavy").type == pa.list_(pa.int64())
    assert table.schema.field("island").type == pa.list_(pa.string())
    assert {v[0] for v in table.column("heavy").to_pylist() if v} == {0, 1}


def test_the_schema_command_types_parquet_columns(parquet_file, tmp_path):
    config = Config(data=spec_for(parquet_file), output_dir=str(tmp_path / "out"))
    text = infer_schema_text(config, work_dir=str(tmp_path / "work"))
    for name, kind in (("body_mass_g", "INT"), ("bill_length_mm", "FLOAT"), ("sex", "BYTES")):
        block = text.split(f'name: "{name}"', 1)[1].split("feature {", 1)[0]
        assert f"type: {kind}" in block, block


# --- bad Parquet: one paragraph, in the first seconds, before any component --------------------
def _bad_inputs(frame: pd.DataFrame, folder: Path) -> dict[str, tuple[Path, dict, tuple[str, ...]]]:
    """name -> (data path, config changes, words the message must hold)."""
    cases: dict[str, tuple[Path, dict, tuple[str, ...]]] = {}
    renamed = folder / "renamed.parquet"
    frame.to_csv(renamed, index=False)
    cases["csv renamed"] = (renamed, {}, (str(renamed), "not a Parquet file", "a CSV?"))
    no_rows = folder / "no_rows.parquet"
    frame.iloc[:0].to_parquet(no_rows, index=False)
    cases["no rows"] = (no_rows, {}, (str(no_rows), "holds no rows"))
    empty_folder = folder / "empty_folder"
    empty_folder.mkdir()
    cases["folder without parquet"] = (empty_folder, {}, (str(empty_folder), "no .parquet files"))
    for name, values, arrow in (
        ("seen_at", pd.to_datetime(frame["study_year"] + 2007, format="%Y"), "timestamp[ns]"),
        ("tags", [[v] for v in frame["island"]], "list<element: string>"),
        ("price", [decimal.Decimal("1.50")] * len(frame), "decimal128"),
        ("blob", [b"\x00\x01"] * len(frame), "binary"),
    ):
        odd = frame.copy()
        odd[name] = values
        path = folder / f"{name}.parquet"
        odd.to_parquet(path, index=False)
        cases[f"unsupported {name}"] = (
            path,
            {"categorical": (*STRINGS, name)},
            (repr(name), arrow, "integer, float, boolean and string columns only"),
        )
    mixed = folder / "mixed"
    mixed.mkdir()
    frame.iloc[:200].to_parquet(mixed / "a.parquet", index=False)
    other = frame.iloc[200:].copy()
    other["body_mass_g"] = other["body_mass_g"].astype("float64")
    other.to_parquet(mixed / "b.parquet", index=False)
    cases["schemas differ"] = (
        mixed,
        {},
        (str(mixed / "a.parquet"), str(mixed / "b.parquet"), "'body_mass_g'", "double", "int64"),
    )
    return cases


def test_bad_parquet_is_refused_with_one_paragraph_in_process(frame, tmp_path):
    for name, (path, changes, words) in _bad_inputs(frame, tmp_path).items():
        with pytest.raises(DataError) as caught:
            stage(path, tmp_path / "out", **changes)
        message = str(caught.value)
        assert "\n" not in message, (name, message)
        for word in words:
            assert word in message, (name, word, message)


def test_a_parquet_file_under_format_csv_is_named_as_parquet(parquet_file, tmp_path):
    with pytest.raises(DataError, match=r"is a Parquet file, but `data.format` is 'csv'"):
        stage(parquet_file, tmp_path / "out", format="csv")


def test_init_drops_unsupported_columns_and_refuses_bad_files(frame, tmp_path):
    cases = _bad_inputs(frame, tmp_path)
    for name, (path, _, words) in cases.items():
        if name.startswith("unsupported"):
            column = words[0].strip("'")
            inference = infer_columns(path, label=LABEL)
            report = inference.report(column)
            assert report.kind == "dropped" and words[1] in report.reason, (name, report)
            continue
        if name == "folder without parquet":  # init is not told the format of an empty folder
            words = (str(path), "has no files in it")
        with pytest.raises(DataError) as caught:
            infer_columns(path, label=LABEL)
        for word in words:
            assert word in str(caught.value), (name, word, str(caught.value))
    # An unsupported label is refused, named.
    with pytest.raises(DataError, match=r"label column 'seen_at' is of an unsupported type"):
        infer_columns(cases["unsupported seen_at"][0], label="seen_at")


@pytest.mark.slow  # three CLI processes
def test_bad_parquet_stops_the_cli_before_any_component(frame, tmp_path):
    cases = _bad_inputs(frame, tmp_path)
    for name in ("csv renamed", "schemas differ", "unsupported seen_at"):
        path, changes, words = cases[name]
        config_path = tmp_path / f"{name.replace(' ', '_')}.yaml"
        data = dataclasses.asdict(spec_for(path, **changes))
        config_path.write_text(yaml.safe_dump({"data": json.loads(json.dumps(data))}))
        started = time.monotonic()
        run = run_cli(
            "run", "--config", str(config_path), "--output-dir", str(tmp_path / "out"),
            "--set", "tracking.enabled=false",
        )  # fmt: skip
        seconds = time.monotonic() - started
        output = run.stdout + run.stderr
        assert run.returncode != 0, output
        assert "Traceback" not in output and "[pipeline]" not in output, output[-3000:]
        # The CLI wraps its paragraph to the terminal's width, wherever the path ends.
        text = " ".join(output.split())
        for word in words:
            assert word in text, (name, word, output[-2000:])
        assert seconds < 60, seconds  # interpreter and TensorFlow start-up dominate


def test_kubeflow_compiles_the_parquet_example_gen_with_its_resources():
    from pipelines.kubeflow_v2_runner import compile_pipeline

    config = load_config(
        overrides=[
            "data.format=parquet",
            "data.path=/mnt/data/penguins",
            "kubeflow.resources.example_gen.memory_limit=9Gi",
        ]
    )
    executors = compile_pipeline(config).pipeline_spec["deploymentSpec"]["executors"]
    container = executors["ArrowExampleGen_executor"]["container"]
    assert container["resources"]["resourceMemoryLimit"] == "9Gi"
    args = container["args"]
    assert args[args.index("--executor_class_path") + 1] == "components.arrow_example_gen.Executor"
