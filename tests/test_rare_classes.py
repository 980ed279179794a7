"""Rare classes: every class the run meets is in the label vocabulary, and rare ones are named.

A class that occurred only in the eval split used to crash the run after training (label id -1
in the Evaluator). Staging now splits CSV input itself, stratified by label, so every class
keeps a row in train; classes too rare for both splits are reported before any component runs.
TFRecord input keeps ExampleGen's hash split, and staging stops when it would put a class in
eval only.

The user's path once, as a pipeline run: scikit-learn's bundled Iris data with one-row and
two-row extra classes (string labels) that ExampleGen's hash split put into eval only (the run
failed after training with "Received a label value of -1"), `init` then `run` -> a pushed model,
the rare classes named. Integer labels take the same staging code; they are checked at the
staging level.
"""

from __future__ import annotations

import csv
import os
import random
from collections import Counter
from pathlib import Path

import pytest
import tensorflow as tf
import tensorflow_transform as tft
from sklearn.datasets import load_diabetes, load_iris

from fullthrottle.core.config import load_config
from fullthrottle.core.errors import DataError
from fullthrottle.core.features import LABEL_VOCAB
from fullthrottle.core.splits import (
    SPLITS,
    STRATIFIED_RANGE,
    eval_mask,
    eval_rows_for,
    hash_split,
    row_key64,
)
from fullthrottle.core.staging import STAGED_CSV, prepare_data
from tests.helpers import label_of, last_run, once_per_session, run_cli

FEATURES = ("sepal length (cm)", "sepal width (cm)", "petal length (cm)", "petal width (cm)")
LABEL = "species"
# Extra classes, with their row counts: one row cannot be in both splits, two can.
STRING_EXTRAS = {"setosa-dwarf": 1, "virginica-albino": 1, "hybrid": 2}
INTEGER_EXTRAS = {"7": 1, "8": 1, "9": 2}
RARE_STRINGS = "'setosa-dwarf' (1 row), 'virginica-albino' (1 row)"
TRAIN_STEPS = 300
# Chooses the extra rows: with this seed ExampleGen's hash split (the split before staging split
# by label) puts both one-row classes into eval only, which crashed the run after training.
SEED = 45


def write_iris_csv(path: Path, *, integer_labels: bool, extras: dict[str, int]) -> list[list[str]]:
    """scikit-learn's bundled Iris (150 rows, 3 classes) plus `extras`: class -> rows, each row
    a measurement of an existing flower, slightly changed."""
    iris = load_iris()
    rows = [
        [*(f"{value:.1f}" for value in features), str(target) if integer_labels else name]
        for features, target, name in zip(
            iris.data, iris.target, iris.target_names[iris.target], strict=True
        )
    ]
    pick = random.Random(SEED)
    for label, count in extras.items():
        for _ in range(count):
            features = iris.data[pick.randrange(len(iris.data))]
            rows.append([*(f"{value + pick.choice((0.1, 0.2)):.1f}" for value in features), label])
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow([*FEATURES, LABEL])
        writer.writerows(rows)
    return rows


def _iris_config(tmp_path: Path, data: Path):
    """A config on an Iris-like CSV at `data`, writing under `tmp_path`."""
    return load_config(
        overrides=[
            f"output_dir={tmp_path / 'out'}",
            f"data.path={data}",
            f"data.label={LABEL}",
            f"data.numeric={list(FEATURES)}",
            "data.categorical=[]",
        ]
    )


def _staged_labels(staged_dir: Path, split: str) -> Counter[str]:
    with (staged_dir / split / STAGED_CSV).open(newline="", encoding="utf-8") as f:
        return Counter(row[LABEL] for row in csv.DictReader(f))


# --- the stratified split ------------------------------------------------------------------------
def _split(labels, rows, *, train_buckets=3, eval_buckets=1) -> list[str]:
    """Staging's split of `rows` (cells) by `labels`, as "train"/"eval" per row."""
    classes = sorted(set(labels))
    mask = eval_mask(
        [classes.index(label) for label in labels],
        [row_key64(row) for row in rows],
        train_buckets=train_buckets,
        eval_buckets=eval_buckets,
    )
    return ["eval" if m else "train" for m in mask]


def test_the_split_is_deterministic_and_independent_of_the_row_order():
    pick = random.Random(1)
    rows = [[str(pick.random()), pick.choice("abcde")] for _ in range(500)]
    labels = [row[1] for row in rows]
    first = _split(labels, rows)
    assert first == _split(labels, rows)
    order = list(range(len(rows)))
    pick.shuffle(order)
    shuffled = [rows[i] for i in order]
    moved = _split([r[1] for r in shuffled], shuffled)
    assert {tuple(rows[i]) for i, s in zip(order, moved, strict=True) if s == "eval"} == {
        tuple(r) for r, s in zip(rows, first, strict=True) if s == "eval"
    }


def test_every_class_keeps_a_train_row_and_big_classes_get_their_eval_share():
    counts = {"big": 400, "odd": 7, "pair": 2, "one": 1, "other_one": 1}
    labels = [label for label, count in counts.items() for _ in range(count)]
    rows = [[label, str(i)] for i, label in enumerate(labels)]
    for train_buckets, eval_buckets in ((3, 1), (4, 1), (1, 1), (1, 3)):
        split = _split(labels, rows, train_buckets=train_buckets, eval_buckets=eval_buckets)
        per_class = Counter(zip(labels, split, strict=True))
        for label, count in counts.items():
            assert per_class[label, "train"] >= 1, (label, train_buckets, eval_buckets)
            assert per_class[label, "eval"] == eval_rows_for(
                count, train_buckets=train_buckets, eval_buckets=eval_buckets
            )
        share = eval_buckets / (train_buckets + eval_buckets)
        assert per_class["big", "eval"] == round(400 * share)
    assert eval_rows_for(7, train_buckets=4, eval_buckets=1) == 1  # 1.4 rounds to 1
    assert eval_rows_for(2, train_buckets=3, eval_buckets=1) == 1  # 0.5 rounds up
    assert eval_rows_for(1, train_buckets=1, eval_buckets=3) == 0  # the one row trains
    assert eval_rows_for(2, train_buckets=1, eval_buckets=3) == 1  # never all rows to eval


def test_integer_labels_are_staged_with_every_class_in_train_and_rare_ones_named(tmp_path):
    data = tmp_path / "iris_int.csv"
    write_iris_csv(data, integer_labels=True, extras=INTEGER_EXTRAS)
    config = _iris_config(tmp_path, data)
    prepared = prepare_data(config)
    train = _staged_labels(config.staged_data_dir, "train")
    evaluated = _staged_labels(config.staged_data_dir, "eval")
    assert set(train) == {"0", "1", "2", "7", "8", "9"}
    assert set(evaluated) <= set(train)
    # 50 rows a class: 13 (12.5 rounded up) to eval; the two-row class gives one row to eval.
    assert evaluated == {"0": 13, "1": 13, "2": 13, "9": 1}
    assert prepared.split.not_evaluated == {"7": 1, "8": 1}
    assert prepared.split.rare_classes_message() == (
        "2 classes of 'species' have too few rows to be in both splits: trained on, never "
        "evaluated: '7' (1 row), '8' (1 row). Add rows of them for the evaluation to measure "
        "them."
    )

    # Unchanged content keeps both files as they are (ExampleGen's cache holds); a changed
    # input rewrites them, and a file of another layout is removed.
    staged = [config.staged_data_dir / split / STAGED_CSV for split in SPLITS]
    for path in staged:
        os.utime(path, (1_000_000, 1_000_000))
    (config.staged_data_dir / STAGED_CSV).write_text("stale")
    prepare_data(config)
    assert [path.stat().st_mtime for path in staged] == [1_000_000, 1_000_000]
    assert sorted(p.name for p in config.staged_data_dir.iterdir()) == sorted(SPLITS)
    with data.open("a", encoding="utf-8") as f:
        f.write("5.0,3.0,1.5,0.2,0\n")
    prepare_data(config)
    assert any(path.stat().st_mtime != 1_000_000 for path in staged)


def test_too_few_rows_for_any_eval_row_are_refused_before_the_run(tmp_path):
    data = tmp_path / "tiny.csv"
    data.write_text(f"{','.join(FEATURES)},{LABEL}\n1,2,3,4,a\n1,2,3,5,b\n1,2,3,6,c\n")
    config = _iris_config(tmp_path, data)
    with pytest.raises(DataError) as refused:
        prepare_data(config)
    message = " ".join(str(refused.value).split())
    assert (
        "no class of the label 'species' has enough rows to give one to the eval split" in message
    )
    assert (
        "(3 rows in all; with `data.train_buckets` 3 : `data.eval_buckets` 1 a class needs 2 rows)"
        in message
    )


# --- TFRecord input: ExampleGen's hash split, checked in staging ---------------------------------
def _example(value: float, label: str) -> bytes:
    feature = {
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[value])),
        LABEL: tf.train.Feature(bytes_list=tf.train.BytesList(value=[label.encode()])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def test_hash_split_is_where_examplegen_puts_a_record():
    from tfx.components.example_gen.base_example_gen_executor import _PartitionFn
    from tfx.proto import example_gen_pb2

    records = [_example(i / 7, "a") for i in range(200)]
    for train_buckets, eval_buckets in ((3, 1), (1, 1), (7, 3)):
        buckets = [train_buckets, train_buckets + eval_buckets]
        theirs = [
            SPLITS[_PartitionFn(r, 2, buckets, example_gen_pb2.SplitConfig())] for r in records
        ]
        ours = [
            hash_split(r, train_buckets=train_buckets, eval_buckets=eval_buckets) for r in records
        ]
        assert ours == theirs
        assert set(ours) == {"train", "eval"}


def test_tfrecords_whose_hash_split_leaves_a_class_out_of_train_stop_in_staging(tmp_path):
    records = [_example(i / 7, "common") for i in range(40)]
    lonely = next(
        r
        for i in range(100)
        if hash_split(r := _example(1000 + i, "lonely"), train_buckets=3, eval_buckets=1) == "eval"
    )
    trained_once = next(
        r
        for i in range(100)
        if hash_split(r := _example(2000 + i, "once"), train_buckets=3, eval_buckets=1) == "train"
    )
    folder = tmp_path / "records"
    folder.mkdir()
    overrides = [
        f"output_dir={tmp_path / 'out'}",
        f"data.path={folder}",
        "data.format=tfrecord",
        f"data.label={LABEL}",
        "data.numeric=[x]",
        "data.categorical=[]",
    ]
    with tf.io.TFRecordWriter(str(folder / "part-0.tfrecord")) as writer:
        for record in [*records, trained_once]:
            writer.write(record)
    prepared = prepare_data(load_config(overrides=overrides))
    assert prepared.split.not_evaluated == {"once": 1}
    assert prepared.rows == 41
    with tf.io.TFRecordWriter(str(folder / "part-1.tfrecord")) as writer:
        writer.write(lonely)
    with pytest.raises(DataError) as refused:
        prepare_data(load_config(overrides=overrides))
    message = " ".join(str(refused.value).split())
    assert (
        "put every record of 1 class of the label 'species' into the eval split: 'lonely' (1 row)"
        in message
    )
    assert "export the data as CSV, which `fullthrottle run` splits stratified by label" in message


# --- the user's path: Iris with rare classes, init, run -------------------------------------------
def _iris_run(folder: Path) -> dict:
    data = folder / "iris.csv"
    write_iris_csv(data, integer_labels=False, extras=STRING_EXTRAS)
    config = folder / "iris.yaml"
    init = run_cli("init", "--data", str(data), "--label", LABEL, "--output", str(config))
    assert init.returncode == 0, init.stderr[-3000:]
    run = run_cli(
        "run", "--config", str(config), "--output-dir", str(folder / "runs"),
        "--set", f"training.train_steps={TRAIN_STEPS}",
    )  # fmt: skip
    return {
        "output_dir": str(folder / "runs"),
        "returncode": run.returncode,
        "stdout": run.stdout,
        "stderr": run.stderr,
    }


@pytest.fixture(scope="module")
def iris_run(tmp_path_factory) -> dict:
    return once_per_session(tmp_path_factory, "iris_rare_classes", _iris_run)


@pytest.mark.slow
def test_iris_with_eval_only_prone_classes_pushes_a_model_and_names_the_rare_ones(iris_run):
    said = iris_run["stdout"] + iris_run["stderr"]
    assert iris_run["returncode"] == 0, said[-5000:]
    assert "Traceback" not in said
    last = last_run(Path(iris_run["output_dir"]))
    assert last["blessed"] is True and last["pushed_model_dir"], last
    # Named in the first lines, before any component ran, and again in the summary.
    stderr = iris_run["stderr"]
    rare = f"trained on, never evaluated: {RARE_STRINGS}"
    assert rare in " ".join(stderr.split())
    assert stderr.index("never evaluated") < stderr.index("ExampleGen")
    assert f"never evaluated (too few rows for both splits): {RARE_STRINGS}" in iris_run["stdout"]
    assert last["split"] == {
        "method": "stratified by label",
        "rows": {"train": 150 - 39 + 3, "eval": 39 + 1},
        "classes": 6,
        "classes_not_evaluated": {"setosa-dwarf": 1, "virginica-albino": 1},
        "classes_not_trained": {},
    }


@pytest.mark.slow
def test_the_label_vocabulary_holds_every_class_and_eval_holds_no_unseen_one(iris_run):
    last = last_run(Path(iris_run["output_dir"]))
    root = Path(last["pipeline_root"])
    (graph,) = root.glob("Transform/transform_graph/*")
    vocabulary = tft.TFTransformOutput(str(graph)).vocabulary_by_name(LABEL_VOCAB)
    everything = {"setosa", "versicolor", "virginica", *STRING_EXTRAS}
    assert {value.decode() for value in vocabulary} == everything
    labels, records = {}, {}
    for split in SPLITS:
        files = sorted(root.glob(f"ArrowExampleGen/examples/*/Split-{split}/*"))
        assert files, split
        dataset = tf.data.TFRecordDataset([str(f) for f in files], compression_type="GZIP")
        records[split] = [record.numpy() for record in dataset]
        labels[split] = Counter(label_of(record, LABEL) for record in records[split])
    assert set(labels["train"]) == everything
    assert labels["eval"] == {"setosa": 13, "versicolor": 13, "virginica": 13, "hybrid": 1}
    # The data exercises the old failure: ExampleGen's hash split (TFX's own partition function,
    # on the examples CsvExampleGen made) would have put every one-row class into eval only.
    from tfx.components.example_gen.base_example_gen_executor import _PartitionFn
    from tfx.proto import example_gen_pb2

    one_row = [
        tf.train.Example.FromString(record)
        for record in records["train"]
        if STRING_EXTRAS.get(label_of(record, LABEL)) == 1
    ]
    assert len(one_row) == 2
    for example in one_row:
        assert SPLITS[_PartitionFn(example, 2, [3, 4], example_gen_pb2.SplitConfig())] == "eval"
    # The Evaluator measured every eval row.
    assert last["eval_metrics"]["example_count"] == 40


def test_the_gate_stops_on_eval_rows_of_a_class_train_lacks(tmp_path):
    """Data put where ExampleGen reads without `fullthrottle run` (a Kubeflow input folder) can
    hold such a split: the DataGate names the classes and counts their rows before Transform."""
    from components.data_gate import data_findings, format_report

    header = f"{','.join(FEATURES)},{LABEL}\n"
    for split, rows in {
        "train": ["1.0,2.0,3.0,4.0,a", "1.0,2.0,3.0,5.0,b"],
        "eval": ["1.0,2.0,3.0,4.5,a", "1.0,2.0,3.0,6.0,stray", "1.0,2.0,3.0,6.5,stray"],
    }.items():
        (tmp_path / split).mkdir()
        (tmp_path / split / STAGED_CSV).write_text(header + "\n".join(rows) + "\n")
    config = load_config(
        overrides=[
            f"data.label={LABEL}",
            f"data.numeric={list(FEATURES)}",
            "data.categorical=[]",
        ]
    )
    types = {**dict.fromkeys(FEATURES, "FLOAT"), LABEL: "BYTES"}
    (finding,) = data_findings(config.data, input_base=str(tmp_path), schema_types=types)
    message = " ".join(
        format_report([], input_files=str(tmp_path), schema_source="", findings=[finding]).split()
    )
    assert (
        "column 'species' (in `data.label`): 1 class with rows in the eval split and none in "
        "train (from the `train/` and `eval/` folders): 'stray' (2 rows)."
    ) in message
    assert "copy both split folders, `train/` and `eval/`" in message
    assert "Transform and Trainer did not run" in message


def test_a_regression_label_is_split_by_ranges_of_its_values(tmp_path):
    """scikit-learn's diabetes target (442 rows, 214 distinct values): stratified by value, most
    values would be one-row classes kept in train; by ranges, eval gets its share of every part
    of the label's range and no class is named."""
    frame = load_diabetes(as_frame=True).frame
    data = tmp_path / "diabetes.csv"
    frame.to_csv(data, index=False)
    features = [column for column in frame.columns if column != "target"]
    config = load_config(
        overrides=[
            f"output_dir={tmp_path / 'out'}",
            f"data.path={data}",
            "data.label=target",
            "data.task=regression",
            "evaluation.max_mae=70",
            f"data.numeric={features}",
            "data.categorical=[]",
        ]
    )
    prepared = prepare_data(config)
    staged = {}
    for split in SPLITS:
        with (config.staged_data_dir / split / STAGED_CSV).open(newline="", encoding="utf-8") as f:
            staged[split] = sorted(float(row["target"]) for row in csv.DictReader(f))
    assert len(staged["train"]) + len(staged["eval"]) == 442
    # 22 runs of 20 sorted values give 5 each to eval (a quarter, 3 : 1); the last run of 2
    # rows gives its half row rounded up.
    assert len(staged["eval"]) == 22 * 5 + 1
    assert prepared.split.method == STRATIFIED_RANGE
    # Every fifth of the range has its quarter in eval (within one run of 20 values).
    values = sorted(frame["target"])
    for fifth in range(5):
        low, high = values[fifth * 88], values[(fifth + 1) * 88 - 1]
        inside = sum(low <= value <= high for value in staged["eval"])
        assert 22 - 5 <= inside <= 22 + 5, (fifth, inside)
    assert prepared.split.not_evaluated == {} and prepared.split.rare_classes_message() is None
    assert "regression label" in prepared.split.describe()
    assert prepared.split.to_dict()["classes"] is None
