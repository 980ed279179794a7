"""The cell checks shared by init, staging and the DataGate (fullthrottle/core/data_checks.py)."""

from __future__ import annotations

import pytest

from fullthrottle.core.config import load_config
from fullthrottle.core.data_checks import (
    DECIMAL_COMMA,
    TEXT,
    THOUSANDS_COMMA,
    THOUSANDS_DOT,
    THOUSANDS_SPACE,
    UNIT,
    cell_kind,
    gate_findings,
    inspect_labels,
    inspect_numbers,
    normalize_number,
)
from fullthrottle.core.errors import DataError
from fullthrottle.core.splits import SPLITS
from fullthrottle.core.staging import STAGED_CSV, prepare_data, read_input_cells


@pytest.mark.parametrize(
    ("cell", "decimal", "thousands", "plain"),
    [
        ("18.5", ".", None, "18.5"),
        ("18,9", ".", None, None),
        ("18,9", ",", None, "18.9"),
        ("18.5", ",", None, "18.5"),  # points still read next to commas
        ("18,9", ".", ",", None),  # never 189: thousands come in groups of three
        ("1,234.5", ".", ",", "1234.5"),
        ("12,345,678", ".", ",", "12345678"),
        ("1.234,5", ",", ".", "1234.5"),
        ("18.5", ",", ".", None),  # with thousands ".", a point must group three digits
        ("1 234", ".", " ", "1234"),
        ("1\u202f234,5", ",", " ", "1234.5"),
        ("-3,5", ",", None, "-3.5"),
        ("1,2,3", ",", None, None),
        ("nan", ".", None, "nan"),
    ],
)
def test_numbers_are_read_in_the_configured_notation(cell, decimal, thousands, plain):
    assert normalize_number(cell, decimal=decimal, thousands=thousands) == plain


@pytest.mark.parametrize(
    ("cell", "kind"),
    [
        ("18,9", DECIMAL_COMMA),
        ("1,234.5", THOUSANDS_COMMA),
        ("1.234,5", THOUSANDS_DOT),
        ("1 234", THOUSANDS_SPACE),
        ("12 kg", UNIT),
        ("12kg", UNIT),
        ("37.5 °C", UNIT),
        ("5%", UNIT),
        ("$12", UNIT),
        ("n.a.", TEXT),
        ("heavy", TEXT),
        ("3A", TEXT),  # a code, not three amperes: code columns must not look numeric
        ("t0", TEXT),
    ],
)
def test_a_cell_that_is_not_a_number_is_classed(cell, kind):
    assert cell_kind(cell) == kind


def _cells(values):
    return [(f"line {n}", v) for n, v in enumerate(values, start=2)]


def test_a_column_of_numbers_except_a_few_looks_numeric_and_says_where():
    report = inspect_numbers("alcohol", _cells(["13.2"] * 27 + ["18,9", "n.a.", ""]))
    assert report.present == 29 and report.numbers == 27 and report.looks_numeric
    finding = str(report.finding(where="`data.numeric`", categorical_hint="Or not."))
    assert "2 of 29 present cells are not numbers as written" in finding
    assert "'18,9' has a decimal comma (line 29)" in finding
    assert "'n.a.' is not a number (line 30)" in finding
    assert "Set `data.decimal: ','`" in finding and "add it to `data.na_values`" in finding
    # With the suggested option and the missing marker, nothing is left to report.
    fixed = inspect_numbers(
        "alcohol", _cells(["13.2"] * 27 + ["18,9", "n.a."]), decimal=",", na_values=["n.a."]
    )
    assert fixed.finding(where="", categorical_hint="") is None
    # Codes with a few numbers are categories, not dirty numbers.
    codes = inspect_numbers("grade", _cells(["1", "2", "3", "A", "B", "C"] * 5))
    assert not codes.looks_numeric


def test_labels_written_several_ways_are_named_and_merged_into_the_common_spelling():
    labels = inspect_labels(
        "species", _cells(["Adelie"] * 5 + ["Adelie ", " adelie", "Gentoo", "Gentoo", ""])
    )
    finding = str(labels.finding(mode="stop"))
    assert "1 class is written in more than one way" in finding
    assert "'Adelie ' (1 row: line 7)" in finding and "' adelie' (1 row: line 8)" in finding
    assert labels.merges() == {"Adelie ": "Adelie", " adelie": "Adelie"}
    assert labels.finding(mode="keep") is None


def test_the_gate_stops_on_what_transform_would_fail_on_or_train_wrong():
    clean = {"mass": _cells(["3750", "", "4100.5"]), "species": _cells(["Adelie", "Gentoo"])}
    types = {"mass": "FLOAT", "species": "BYTES"}
    common = {"numeric": ["mass"], "label": "species", "label_mode": "stop"}
    assert gate_findings(cells=clean, types=types, **common) == []
    # Typed as text by the schema although the cells read: a text feature Transform cannot cast.
    (typed,) = gate_findings(cells=clean, types={**types, "mass": "BYTES"}, **common)
    assert typed.column == "mass" and "types it as text" in typed.problem
    dirty = {"mass": _cells(["3750", "NA"]), "species": _cells(["Adelie", "adelie"])}
    found = gate_findings(cells=dirty, types={**types, "mass": "BYTES"}, **common)
    assert [f.column for f in found] == ["mass", "species"]
    assert "'NA' is not a number (line 3)" in found[0].problem
    assert "applied when `fullthrottle run` stages a CSV file" in found[0].fix
    # A regression label (passed with the numbers, as the DataGate does) is named as the label.
    price = {"mass": _cells(["3750"]), "price": _cells(["10.5", "cheap"])}
    (label,) = gate_findings(
        cells=price, types={"mass": "FLOAT", "price": "FLOAT"}, numeric=["mass", "price"],
        label="price", label_mode="keep",
    )  # fmt: skip
    assert str(label).startswith("column 'price' (in `data.label`): 1 of 2 present cells")
    assert "'cheap' is not a number (line 3)" in label.problem
    assert "set `data.task: classification`" in label.fix and "data.categorical" not in label.fix


def test_staging_applies_the_notation_and_merges_labels(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text(
        "species,island,bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g,sex,year\n"
        'Adelie,Torgersen,"39,1","18,7",181,"3.750,5",male,2007\n'
        'Adelie ,Dream,"39,5","17,4",186,3800,female,2007\n'
        'Gentoo,Biscoe,"46,1","13,2",211,"4.500",female,2007\n'
    )
    base = [f"output_dir={tmp_path / 'out'}", f"data.path={data}"]
    with pytest.raises(DataError) as stopped:
        prepare_data(load_config(overrides=base))
    message = str(stopped.value)
    assert "'39,1' has a decimal comma (line 2)" in message
    assert "'3.750,5' has a decimal comma and thousands dots (line 2)" in message
    assert "'Adelie ' (1 row: line 3)" in message
    config = load_config(
        overrides=[
            *base,
            "data.decimal=','",
            "data.thousands='.'",
            "data.near_duplicate_labels=merge",
        ]
    )
    prepare_data(config)
    staged = [
        line
        for split in SPLITS
        for line in (config.staged_data_dir / split / STAGED_CSV).read_text().splitlines()[1:]
    ]
    # Plain decimals; whole numbers of numeric columns with ".0" (read as FLOAT downstream).
    assert "Adelie,Torgersen,39.1,18.7,181.0,3750.5,male,2007" in staged
    assert "Adelie,Dream,39.5,17.4,186.0,3800.0,female,2007" in staged
    assert "Gentoo,Biscoe,46.1,13.2,211.0,4500.0,female,2007" in staged


def test_the_gate_reads_headers_as_csvexamplegen_splits_them(tmp_path):
    for split in SPLITS:
        (tmp_path / split).mkdir()
    (tmp_path / "train" / STAGED_CSV).write_text('label,quote"name\nAdelie,1\nGentoo,"2,5"\n')
    (tmp_path / "eval" / STAGED_CSV).write_text('label,quote"name\nGentoo,3\n')
    cells = read_input_cells(str(tmp_path), data_format="csv", columns=['quote"name', "label"])
    assert cells['quote"name'] == [
        ("train/data.csv line 2", "1"),
        ("train/data.csv line 3", "2,5"),
        ("eval/data.csv line 2", "3"),
    ]
    assert [v for _, v in cells["label"]] == ["Adelie", "Gentoo", "Gentoo"]
