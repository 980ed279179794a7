"""`fullthrottle init`: a new user's CSV -> a config -> a pushed model; and bad input to init."""

from __future__ import annotations

import json
import os
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml

from fullthrottle.cli import main
from fullthrottle.commands.init import majority_threshold, max_mae_bar
from fullthrottle.core.columns import label_task
from fullthrottle.core.config import load_config
from serving.signatures import call_signature, signature_input_specs
from tests.helpers import last_run
from tests.own_data import (
    CONSTANT,
    ID,
    LABEL,
    NAMES,
    NOISE,
    NUMERIC,
    TEXT,
    TRAIN_STEPS,
    complete,
    own_data_run,
    write_own_data_csv,
)
from trainer_module.training.config import TrainingConfig


@pytest.fixture(scope="module")
def own_data(tmp_path_factory):
    return own_data_run(tmp_path_factory)


# --- the new user's path ------------------------------------------------------------------------
@pytest.mark.slow
def test_init_infers_each_kind_of_column_and_writes_a_loadable_commented_config(own_data):
    text = own_data.config_path.read_text(encoding="utf-8")
    config = load_config(own_data.config_path)
    assert config.data.label == LABEL
    numeric = {name for name, kind in NOISE.items() if kind in "ni"} | set(NUMERIC)
    assert set(config.data.numeric) == numeric
    categorical = {name for name, kind in NOISE.items() if kind == "c"}
    assert set(config.data.categorical) == categorical | {"Island/Insel", "Sex (M/F)"}
    assert [t.name for t in config.data.text] == [TEXT]
    assert config.data.text[0].tokenizer == "word"
    # "NA" was seen in the sample, so it is declared missing.
    assert config.data.na_values == ("NA",)
    # The data path is relative to the config file, which load_config resolves.
    assert Path(config.data.path) == own_data.csv_path.resolve()
    # Dropped columns are explained, not silently lost.
    assert f"{ID}: every value is distinct" in text
    assert f"{CONSTANT}: a single value ('field station')" in text
    assert set(config.data.feature_columns) == set(NAMES) - {LABEL, ID, CONSTANT}
    # The blessing bar is the majority-class share of the sample, rounded up to three decimals
    # (never below it), not 0.8.
    counts = Counter(r[LABEL] for r in own_data.records)
    share = Fraction(max(counts.values()), len(own_data.records))
    written = Fraction(str(config.evaluation.accuracy_threshold))  # the decimal in the file
    assert share <= written < share + Fraction(1, 1000)
    # Every section and column is commented for the reader.
    assert text.count("#") > 25
    assert "init" in own_data.init_stdout and "dropped" in own_data.init_stdout


@pytest.mark.slow
def test_run_on_the_init_config_pushes_a_model_that_answers_raw_rows(own_data):
    result = own_data.run
    assert result.returncode == 0, f"run failed:\n{result.stdout}\n{result.stderr[-5000:]}"
    last = last_run(own_data.output_dir)
    assert last["blessed"] is True and last["pushed_model_dir"], last
    assert last["training"]["steps_completed"] == TRAIN_STEPS
    model = tf.saved_model.load(last["pushed_model_dir"])
    # Raw rows as a client would send them: one tensor per column the model uses. predict_raw
    # asks for exactly the config's feature columns: not the label, not the columns init dropped.
    rows = [r for r in own_data.records[:200] if complete(r)]
    specs = signature_input_specs(model, "predict_raw")
    kept = set(load_config(own_data.config_path).data.feature_columns)
    assert set(specs) == kept
    assert kept < set(own_data.records[0]) - {LABEL}, "init drops the id and constant columns"
    inputs = {}
    for name, spec in specs.items():
        if spec.dtype == tf.string:
            inputs[name] = tf.constant([r[name] for r in rows])
        elif spec.dtype.is_integer:
            inputs[name] = tf.constant([int(r[name]) for r in rows], dtype=spec.dtype)
        else:
            cells = [float(r[name].replace(",", ".")) for r in rows]
            inputs[name] = tf.constant(cells, dtype=spec.dtype)
    outputs = call_signature(model, "predict_raw", inputs)
    probabilities = outputs["probabilities"].numpy()
    assert probabilities.shape == (len(rows), 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    predicted = [c.decode() for c in outputs["classes"].numpy()]
    truth = [r[LABEL].strip().capitalize() for r in rows]
    accuracy = np.mean([p == t for p, t in zip(predicted, truth, strict=True)])
    majority = max(Counter(truth).values()) / len(rows)
    assert accuracy > majority + 0.2, (accuracy, majority)

    # Rows with missing cells go in as tf.Examples (serving_default): absent features are missing.
    def example(row):
        feature = {}
        for name, spec in specs.items():
            cell = row[name]
            if cell in ("", "NA"):
                continue
            if spec.dtype == tf.string:
                value = tf.train.BytesList(value=[cell.encode()])
                feature[name] = tf.train.Feature(bytes_list=value)
            elif spec.dtype.is_integer:
                feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(cell)]))
            else:
                value = tf.train.FloatList(value=[float(cell.replace(",", "."))])
                feature[name] = tf.train.Feature(float_list=value)
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    gappy = [r for r in own_data.records if not complete(r)][:20]
    assert gappy
    served = model.signatures["serving_default"](examples=tf.constant([example(r) for r in gappy]))
    assert np.isfinite(served["probabilities"].numpy()).all()


# --- bad input: clear messages, nothing written ------------------------------------------------
def _init(capsys, *args: str) -> tuple[int, str]:
    code = main(["init", *args])
    captured = capsys.readouterr()
    # The CLI wraps messages at 100 columns; compare the words.
    return code, " ".join((captured.err + captured.out).split())


def test_init_refuses_a_binary_file_that_is_not_csv(tmp_path, capsys):
    data = tmp_path / "photo.csv"
    data.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    out = tmp_path / "cfg.yaml"
    code, message = _init(capsys, "--data", str(data), "--label", "y", "--output", str(out))
    assert code == 2
    assert str(data) in message and "not a CSV" in message
    assert "Traceback" not in message
    assert not out.exists()


def test_init_refuses_text_that_is_not_comma_separated(tmp_path, capsys):
    data = tmp_path / "table.csv"
    data.write_text("a;b;label\n1;2;x\n3;4;y\n", encoding="utf-8")
    code, message = _init(
        capsys, "--data", str(data), "--label", "label", "--output", str(tmp_path / "c.yaml")
    )
    assert code == 2
    assert "single column" in message and "delimiter" in message


def test_init_names_the_missing_label_column_and_the_ones_that_exist(tmp_path, capsys):
    data = tmp_path / "export.csv"
    write_own_data_csv(data)
    code, message = _init(
        capsys,
        "--data",
        str(data),
        "--label",
        "species name/art",
        "--output",
        str(tmp_path / "c.yaml"),
    )
    assert code == 2
    assert "no label column 'species name/art'" in message
    assert f"did you mean {LABEL!r}" in message
    assert "Island/Insel" in message and "--label" in message


def test_init_refuses_a_label_with_a_single_value(tmp_path, capsys):
    data = tmp_path / "one_class.csv"
    data.write_text("x,y\n1,same\n2,same\n3,same\n", encoding="utf-8")
    code, message = _init(
        capsys, "--data", str(data), "--label", "y", "--output", str(tmp_path / "c.yaml")
    )
    assert code == 2
    assert "label column 'y'" in message and "only the value 'same'" in message
    assert "at least two classes" in message


def test_init_drops_a_single_value_feature_with_a_note(tmp_path, capsys):
    data = tmp_path / "d.csv"
    data.write_text("x,const,y\n1,k,a\n2,k,b\n3,k,a\n4,,b\n", encoding="utf-8")
    out = tmp_path / "c.yaml"
    code, message = _init(capsys, "--data", str(data), "--label", "y", "--output", str(out))
    assert code == 0, message
    assert "const" in message and "dropped" in message
    config = load_config(out)
    assert "const" not in config.data.feature_columns
    assert "#   const: a single value ('k')" in out.read_text()


def test_init_refuses_data_with_no_feature_that_varies(tmp_path, capsys):
    data = tmp_path / "d.csv"
    data.write_text("const,y\nk,a\nk,b\n", encoding="utf-8")
    code, message = _init(
        capsys, "--data", str(data), "--label", "y", "--output", str(tmp_path / "c.yaml")
    )
    assert code == 2
    assert "no usable feature column" in message and "const" in message


def test_init_writes_the_majority_share_as_the_bar_never_rounded_down():
    # 399 of 1000 rows: the bar is 0.399 (it was once written as 0.39, below the trivial model).
    assert majority_threshold((("a", 399), ("b", 350), ("c", 251))) == 0.399
    assert majority_threshold((("a", 1), ("b", 1), ("c", 1))) == 0.334
    assert majority_threshold((("a", 1), ("b", 1))) == 0.5
    assert majority_threshold((("a", 152), ("b", 124), ("c", 68))) == 0.442  # penguins: 0.44186


def test_one_huge_cell_does_not_turn_a_categorical_column_into_text(tmp_path, capsys):
    islands = ("Biscoe", "Dream", "Torgersen")
    rows = ["island,bill,y"] + [f"{islands[i % 3]},{40 + i % 7},{'ab'[i % 2]}" for i in range(60)]
    rows[31] = f"{'x' * 12_000},41,a"  # data line 31 is line 32 of the file
    data = tmp_path / "d.csv"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "c.yaml"
    code, message = _init(capsys, "--data", str(data), "--label", "y", "--output", str(out))
    assert code == 0, message
    config = load_config(out)
    assert config.data.categorical == ("island",) and config.data.text == ()
    # The outlier is reported with its line and length, on the screen and in the file.
    assert "a cell far longer than the typical 6 characters (12,000 at line 32)" in message
    assert "(12,000 at line 32)" in out.read_text(encoding="utf-8")
    # A column of long values is still text: the typical value decides, both ways.
    notes = [
        f"note {i}: " + "the delivery was late and the box was damaged " * 2 for i in range(60)
    ]
    rows = ["note,y"] + [f"{n},{'ab'[i % 2]}" for i, n in enumerate(notes)]
    rows[5] = "ok,a"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    code, message = _init(
        capsys, "--data", str(data), "--label", "y", "--output", str(out), "--force"
    )
    assert code == 0, message
    assert [t.name for t in load_config(out).data.text] == ["note"]
    assert "long strings (median" in message


def test_init_never_overwrites_an_existing_config(tmp_path, capsys):
    data = tmp_path / "d.csv"
    data.write_text("x,y\n1,a\n2,b\n", encoding="utf-8")
    out = tmp_path / "mine.yaml"
    out.write_text("# my edits\n", encoding="utf-8")
    code, message = _init(capsys, "--data", str(data), "--label", "y", "--output", str(out))
    assert code == 2 and "already exists" in message and "--force" in message
    assert out.read_text() == "# my edits\n"
    code, _ = _init(capsys, "--data", str(data), "--label", "y", "--output", str(out), "--force")
    assert code == 0 and load_config(out).data.numeric == ("x",)


def test_init_text_flag_and_cjk_text_use_the_char_tokenizer(tmp_path, capsys):
    data = tmp_path / "d.csv"
    rows = ["note,tag,y"] + [f"今天的比赛非常好看{i},t{i % 3},{'ab'[i % 2]}" for i in range(30)]
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "c.yaml"
    code, message = _init(
        capsys, "--data", str(data), "--label", "y", "--text", "note", "--output", str(out)
    )
    assert code == 0, message
    config = load_config(out)
    assert [(t.name, t.tokenizer) for t in config.data.text] == [("note", "char")]
    assert config.data.categorical == ("tag",)
    # max_tokens covers the ~11 characters of these notes, in multiples of 8.
    assert config.data.text[0].max_tokens == 16


def test_init_reads_a_tfrecord_folder(tmp_path, capsys):
    folder = tmp_path / "records"
    folder.mkdir()
    with tf.io.TFRecordWriter(str(folder / "part-0.tfrecord.gz"), options="GZIP") as writer:
        for i in range(40):
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "size": tf.train.Feature(float_list=tf.train.FloatList(value=[i * 0.5])),
                        "color": tf.train.Feature(
                            bytes_list=tf.train.BytesList(value=[b"red" if i % 3 else b"blue"])
                        ),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
                    }
                )
            )
            writer.write(example.SerializeToString())
    out = tmp_path / "c.yaml"
    code, message = _init(capsys, "--data", str(folder), "--label", "label", "--output", str(out))
    assert code == 0, message
    loaded = yaml.safe_load(out.read_text())
    assert loaded["data"]["format"] == "tfrecord"
    config = load_config(out)
    assert config.data.numeric == ("size",) and config.data.categorical == ("color",)
    assert json.dumps(loaded)  # plain data, nothing YAML-specific


def test_the_command_init_prints_trains_where_bin_envrun_shows_data_only_when_named(
    tmp_path, capsys, monkeypatch
):
    """In bin/envrun's userland a host folder under one of the userland's own (/var/lib/x) is
    shown only to a command whose arguments name it. init, started that way, prints the command
    as the user types it, naming the data again; the config file alone would leave it hidden."""
    from fullthrottle.cli import build_parser
    from fullthrottle.commands.options import config_from_args
    from fullthrottle.core.paths import hidden_reason

    named = tmp_path / "var-lib" / "shop"
    named.mkdir(parents=True)
    data = named / "d.csv"
    data.write_text("x,y\n1,a\n2,b\n3,a\n4,b\n", encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    # What `bin/envrun fullthrottle init --data <data> ...` run in `work` sets.
    monkeypatch.setenv("FULLTHROTTLE_HOST_PATHS", f"{work}:{named}")
    monkeypatch.setenv("FULLTHROTTLE_NAMED_PATHS", str(named))
    monkeypatch.setenv("FULLTHROTTLE_ENVRUN", "bin/envrun")
    monkeypatch.setenv("FULLTHROTTLE_ENVRUN_COMMAND_PID", str(os.getpid()))
    code, message = _init(capsys, "--data", str(data), "--label", "y", "--output", "c.yaml")
    assert code == 0, message
    command = f"bin/envrun fullthrottle run --config c.yaml --data {data}"
    assert message.endswith(f"then train: {command}"), message
    assert f"#   fullthrottle run --config c.yaml --data {data}\n" in (work / "c.yaml").read_text()
    # That command names the data, so envrun shows its folder, and the config it builds reads it.
    config = config_from_args(build_parser().parse_args(command.split()[2:]))
    assert Path(config.data.path) == data and hidden_reason(config.data.path) is None
    # `run --config c.yaml` alone: envrun shows the working folder only, and the data is hidden.
    monkeypatch.setenv("FULLTHROTTLE_HOST_PATHS", str(work))
    monkeypatch.delenv("FULLTHROTTLE_NAMED_PATHS")
    assert hidden_reason(load_config(work / "c.yaml").data.path) is not None
    # Data in a folder envrun always shows: the plain command.
    (work / "d.csv").write_text(data.read_text(encoding="utf-8"), encoding="utf-8")
    code, message = _init(capsys, "--data", "d.csv", "--label", "y", "--output", "e.yaml")
    assert code == 0 and message.endswith("then train: bin/envrun fullthrottle run --config e.yaml")
    # The steps init writes are the config's own default.
    assert load_config(work / "e.yaml").training.train_steps == TrainingConfig().train_steps


# --- the label's task ---------------------------------------------------------------------------
def _numbers(values) -> list[str]:
    return [repr(float(v)) if isinstance(v, float) else str(v) for v in values]


@pytest.mark.parametrize(
    ("values", "task", "why"),
    [
        # The diabetes target (442 rows, 214 distinct whole numbers written as 151.0).
        ([f"{25 + (i * 7) % 214}.0" for i in range(442)], "regression", "214 distinct numbers"),
        # 10,000 rows, 150 distinct values with fractions: a measurement.
        (_numbers([round(i % 150 * 0.37, 2) for i in range(10_000)]), "regression", "fractions"),
        # 10,000 rows, 150 distinct whole prices over a wide range (1.5% of the rows).
        ([str(1000 + 37 * (i % 150)) for i in range(10_000)], "regression", "spread over"),
        # 1,000,000 rows of 10,000 distinct whole numbers 0 .. 9999 (1%, dense).
        ([str(i % 10_000) for i in range(1_000_000)], "regression", "10000 distinct numbers"),
        # Class ids: 100 dense ids over 1,000,000 rows; 3 ids over 300 rows; names.
        ([str(i % 100) for i in range(1_000_000)], "classification", "100 distinct values"),
        ([str(i % 3) for i in range(300)], "classification", "3 distinct values"),
        (["Adelie", "Gentoo"] * 200, "classification", "not every label is a number"),
    ],
    ids=["diabetes", "10k-fractions", "10k-prices", "1M-dense-wide", "1M-ids", "3-ids", "names"],
)
def test_the_labels_task_follows_a_rule_that_holds_at_any_row_count(values, task, why):
    decided, reason = label_task(values)
    assert decided == task, reason
    assert why in reason, reason


def test_max_mae_bar_is_the_medians_error_rounded_down_to_four_digits():
    assert max_mae_bar(65.04751) == 65.04
    assert max_mae_bar(0.0123456) == 0.01234
    assert max_mae_bar(123456.0) == 123400.0
    assert max_mae_bar(65.04) == 65.04  # exact values stay


def test_init_task_flag_forces_either_way_and_a_non_number_is_named(tmp_path, capsys):
    data = tmp_path / "scores.csv"
    data.write_text(
        "x,y\n" + "".join(f"{i},{i % 3}\n" for i in range(30)) + "30,high\n", encoding="utf-8"
    )
    code, message = _init(
        capsys, "--data", str(data), "--label", "y", "--task", "regression",
        "--output", str(tmp_path / "c.yaml"),
    )  # fmt: skip
    assert code == 2
    assert "--task regression needs a label of numbers" in message
    assert "'high' is not a number (line 32)" in message
    assert not (tmp_path / "c.yaml").exists()
    numbers = tmp_path / "numbers.csv"
    numbers.write_text(
        "x,y\n" + "".join(f"{i},{i % 3}\n" for i in range(30)) + "30,\n", encoding="utf-8"
    )
    code, said = _init(
        capsys, "--data", str(numbers), "--label", "y", "--task", "regression",
        "--output", str(tmp_path / "r.yaml"),
    )  # fmt: skip
    assert code == 0
    # The row without a label would stop `run`: said at init, with its line.
    assert "1 of 31 sampled rows have no label value (line 32)" in said
    config = load_config(tmp_path / "r.yaml")
    assert config.data.task == "regression" and config.evaluation.max_mae is not None
    assert "task: regression   # --task regression" in (tmp_path / "r.yaml").read_text()
    assert load_config(tmp_path / "r.yaml").evaluation.accuracy_threshold == 0.8  # unused default
    # Fractional numbers would be a regression target; --task classification keeps classes.
    halves = tmp_path / "halves.csv"
    halves.write_text("x,y\n" + "".join(f"{i},{i % 4 / 2}\n" for i in range(40)), encoding="utf-8")
    assert label_task([str(i % 4 / 2) for i in range(40)])[0] == "regression"
    code, _ = _init(
        capsys, "--data", str(halves), "--label", "y", "--task", "classification",
        "--output", str(tmp_path / "k.yaml"),
    )  # fmt: skip
    assert code == 0
    assert load_config(tmp_path / "k.yaml").data.task == "classification"
