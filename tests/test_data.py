"""Data checks and staging happen before the pipeline, and keep the cache valid."""

from __future__ import annotations

import os

import pytest

from fullthrottle.core.config import load_config
from fullthrottle.core.errors import DataError
from fullthrottle.core.splits import SPLITS
from fullthrottle.core.staging import STAGED_CSV, prepare_data
from tests.helpers import REPO


def _config(tmp_path, data_path, *extra):
    return load_config(
        overrides=[f"output_dir={tmp_path / 'out'}", f"data.path={data_path}", *extra]
    )


HEADER = "species,island,bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g,sex,year\n"


def test_bundled_penguins_are_staged_with_missing_values_emptied(tmp_path):
    config = load_config(overrides=[f"output_dir={tmp_path}"])
    prepared = prepare_data(config)
    assert prepared.rows == 344
    train, evaluated = (
        (config.staged_data_dir / split / STAGED_CSV).read_text() for split in SPLITS
    )
    assert train.splitlines()[0] == evaluated.splitlines()[0] == HEADER.strip()
    rows = train.splitlines()[1:] + evaluated.splitlines()[1:]
    assert len(rows) == 344
    assert not any("NA" in row.split(",") for row in rows)  # no NA cell survives
    assert any(",," in row or row.endswith(",") for row in rows)  # missing values: empty cells
    # Numeric columns as decimals, whole numbers too (CsvExampleGen then reads them as FLOAT);
    # a column that is not numeric (year) as it was.
    assert "Adelie,Torgersen,39.1,18.7,181.0,3750.0,male,2007" in rows


def test_a_schema_typing_a_numeric_column_int_is_refused_before_the_run(tmp_path):
    types = {"species": "BYTES", "island": "BYTES", "bill_length_mm": "FLOAT",
             "bill_depth_mm": "FLOAT", "flipper_length_mm": "FLOAT", "body_mass_g": "INT",
             "sex": "BYTES"}  # fmt: skip
    schema = tmp_path / "schema.pbtxt"
    schema.write_text("".join(f'feature {{ name: "{n}" type: {t} }}\n' for n, t in types.items()))
    config = load_config(overrides=[f"output_dir={tmp_path / 'out'}", f"data.schema_path={schema}"])
    with pytest.raises(DataError) as refused:
        prepare_data(config)
    message = " ".join(str(refused.value).split())
    assert "'body_mass_g' as INT" in message
    assert "change their `type: INT` to `type: FLOAT`" in message


def test_unchanged_input_keeps_the_staged_file_untouched(tmp_path):
    config = load_config(overrides=[f"output_dir={tmp_path}"])
    prepare_data(config)
    staged = [config.staged_data_dir / split / STAGED_CSV for split in SPLITS]
    for path in staged:
        os.utime(path, (1_000_000, 1_000_000))
    prepare_data(config)
    assert [path.stat().st_mtime for path in staged] == [1_000_000, 1_000_000], (
        "rewriting would change ExampleGen's fingerprint and miss the cache"
    )
    assert sorted(p.name for p in config.staged_data_dir.iterdir()) == sorted(SPLITS)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (
            HEADER + HEADER + "Adelie,Torgersen,39.1,18.7,181,3750,male,2007\n",
            "header line appears again",
        ),
        (HEADER.replace(",", ";") + "Adelie;Torgersen;39.1;18.7;181;3750;male;2007\n", "delimiter"),
        (HEADER + "Adelie,Torgersen,39.1\n", "3 fields where the header has 8"),
    ],
)
def test_malformed_csv_is_refused_with_the_line(tmp_path, content, needle):
    data = tmp_path / "bad.csv"
    data.write_text(content)
    with pytest.raises(DataError, match=needle):
        prepare_data(_config(tmp_path, data))


def test_non_utf8_bytes_name_the_line(tmp_path):
    data = tmp_path / "latin1.csv"
    data.write_bytes(
        HEADER.encode() + "Adelie,Torgersen,39.1,18.7,181,3750,m\xe4le,2007\n".encode("latin-1")
    )
    with pytest.raises(DataError, match="not UTF-8 text .*line 2"):
        prepare_data(_config(tmp_path, data))


def test_folder_of_csv_files_with_one_header(tmp_path):
    folder = tmp_path / "csvs"
    folder.mkdir()
    (folder / "a.csv").write_text(
        HEADER
        + "Adelie,Torgersen,39.1,18.7,181,3750,male,2007\n"
        + "Adelie,Dream,39.5,17.4,186,3800,female,2007\n"
    )
    (folder / "b.csv").write_text(HEADER + "Gentoo,Biscoe,46.1,13.2,211,4500,female,2007\n")
    prepared = prepare_data(_config(tmp_path, folder))
    assert prepared.rows == 3
    (folder / "c.csv").write_text("species,island\nAdelie,Dream\n")
    with pytest.raises(DataError, match="c.csv has no column"):
        prepare_data(_config(tmp_path, folder))


def test_paths_the_envrun_userland_hides_are_refused_with_the_reason(tmp_path, monkeypatch):
    """Inside bin/envrun's userland only the folders it lists are the host's: a data path or an
    output folder elsewhere is refused saying why, not reported as missing or written away."""
    monkeypatch.setenv("FULLTHROTTLE_HOST_PATHS", f"{tmp_path}:/srv")
    hidden = "/var/lib/exports/penguins.csv"
    with pytest.raises(DataError) as refused:
        prepare_data(_config(tmp_path, hidden))
    message = str(refused.value)
    assert f"data path {hidden} cannot be reached" in message
    assert "not inside bin/envrun's Debian 13 userland: /var there is the userland's own" in message
    assert f"--data {hidden}" in message and "does not exist" not in message
    # Under a folder that is shown, a missing path is missing.
    with pytest.raises(DataError, match="does not exist"):
        prepare_data(_config(tmp_path, tmp_path / "nope.csv"))
    # Outputs written where the host cannot see them would be lost: refused before anything.
    config = load_config(overrides=["output_dir=/opt/runs"])
    with pytest.raises(
        DataError, match=r"output folder \(`output_dir`\) cannot be used: /opt/runs"
    ):
        prepare_data(config)


def _staged_rows(config) -> list[str]:
    """The staged rows of both splits (headers left out)."""
    return [
        line
        for split in SPLITS
        for line in (config.staged_data_dir / split / STAGED_CSV).read_text().splitlines()[1:]
    ]


def _prices_config(tmp_path, data):
    """A regression config on a size -> price CSV."""
    return _config(
        tmp_path,
        data,
        "data.label=price",
        "data.numeric=[size]",
        "data.categorical=[]",
        "data.task=regression",
        "evaluation.max_mae=1",
    )


def test_a_regression_label_must_be_numbers_in_every_row(tmp_path):
    data = tmp_path / "prices.csv"
    data.write_text("size,price\n1,10.5\n2,abc\n3,\n4,12\n5,1 200\n", encoding="utf-8")
    config = _prices_config(tmp_path, data)
    with pytest.raises(DataError) as refused:
        prepare_data(config)
    message = " ".join(str(refused.value).split())
    # Where, what and what to do, in one paragraph, before any component ran.
    assert "column 'price' (in `data.label`)" in message
    assert "'abc' is not a number (line 3)" in message
    assert "Set `data.thousands: ' '`" in message
    assert "`data.task: classification`" in message
    assert "1 row has no label value (line 4)" in message
    assert message.count("column 'price'") == 1, message
    assert not list(config.staged_data_dir.rglob(STAGED_CSV))


def test_a_regression_label_is_staged_as_decimals_and_needs_no_classes(tmp_path):
    data = tmp_path / "prices.csv"
    # One label value only would stop a classifier; a regression label of whole numbers is
    # written as decimals (so ExampleGen reads it as FLOAT, never INT).
    rows = "".join(f"{i},{100 + i}\n" for i in range(300))
    data.write_text("size,price\n" + rows, encoding="utf-8")
    config = _prices_config(tmp_path, data)
    assert prepare_data(config).rows == 300
    staged = _staged_rows(config)
    assert len(staged) == 300 and "0.0,100.0" in staged, staged[:2]
    assert all(row.split(",")[1].endswith(".0") for row in staged), staged


def test_the_bundled_diabetes_config_stages_scikit_learns_data_for_regression(tmp_path):
    from sklearn.datasets import load_diabetes

    config = load_config(REPO / "configs" / "diabetes.yaml", overrides=[f"output_dir={tmp_path}"])
    assert config.data.task == "regression" and config.evaluation.max_mae == 65.0
    prepared = prepare_data(config)
    assert prepared.rows == 442
    header = (config.staged_data_dir / "train" / STAGED_CSV).read_text().splitlines()[0]
    frame = load_diabetes(as_frame=True, scaled=False).frame
    assert header.split(",") == list(frame.columns)
    # The label as written by scikit-learn, a decimal throughout (ExampleGen reads FLOAT).
    labels = [float(line.rsplit(",", 1)[1]) for line in _staged_rows(config)]
    assert sorted(labels) == sorted(frame["target"].tolist())
