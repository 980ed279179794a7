"""A real-world CSV made from the bundled penguins: awkward column names, dirty cells.

`write_awkward_csv` renames the penguins' columns and adds columns of noise so that one file
holds the column-name cases of `NAMES` (one pipeline run covers them all). With `dirty=True` it
also writes what spreadsheets and lab systems produce: decimal commas among decimal points in a
numeric column, and label values that differ only in whitespace or case.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

from fullthrottle.core.bundled import bundled_path

LABEL = "Species name/Art"
LONG_NAME = "measurement_" + "very_" * 40 + "long (200+ characters)"
# Every raw column, as written in the header. The penguins' own columns first.
RENAMED = {
    "species": LABEL,
    "island": "Island/Insel",
    "sex": "Sex (M/F)",
    "bill_length_mm": "bill length (mm)",
    "bill_depth_mm": "od280/od315_of_diluted_wines",
    "flipper_length_mm": "1st.flipper-length",
    "body_mass_g": "温度",
}
# Columns of noise, by name: "n" numeric (float), "i" integer, "c" categorical. Mostly numeric:
# each categorical column is a vocabulary, the slowest thing Transform computes.
NOISE = {
    "Temp": "n",
    "temp": "n",
    "TEMP": "i",
    "class": "n",
    "label": "c",
    "None": "n",
    LONG_NAME: "n",
    "a b": "n",
    "a_b": "n",
    "a-b": "n",
    "a.b": "i",
    "Körpermasse (g)": "n",
    "naïve café": "n",
    "🐧 count": "i",
    "x:y": "n",
    "#id": "i",
    "$price": "n",
    'quote"name': "c",
    ".hidden": "n",
    "__dunder": "n",
}
NAMES = (*RENAMED.values(), *NOISE)
NUMERIC = ("bill length (mm)", "od280/od315_of_diluted_wines", "1st.flipper-length", "温度")
# The cells `dirty=True` changes (0-based data rows), and how.
DECIMAL_COMMA_ROWS = (17, 60, 121, 200)
LABEL_SPACE_ROWS = (5, 40, 77)  # "Adelie" -> "Adelie "
LABEL_CASE_ROWS = (250, 260)  # "Gentoo" -> "gentoo"


def penguin_rows() -> list[dict[str, str]]:
    return list(csv.DictReader(bundled_path("palmerpenguins").read_text().splitlines()))


def write_awkward_csv(path: Path, *, dirty: bool = False, seed: int = 7) -> list[dict[str, str]]:
    """Writes the CSV; returns its rows as dicts keyed by the names as written."""
    rng = random.Random(seed)
    records = []
    for number, penguin in enumerate(penguin_rows()):
        record = {
            new: ("" if penguin[old] == "NA" else penguin[old]) for old, new in RENAMED.items()
        }
        for name, kind in NOISE.items():
            if kind == "n":
                record[name] = f"{rng.gauss(10, 3):.3f}"
            elif kind == "i":
                record[name] = str(rng.randint(0, 9))
            else:
                record[name] = rng.choice(["red", "green", "blue"])
        if dirty:
            length = record["bill length (mm)"]
            if number in DECIMAL_COMMA_ROWS:
                assert "." in length, (number, length)
                record["bill length (mm)"] = length.replace(".", ",")
            if number in LABEL_SPACE_ROWS:
                assert record[LABEL] == "Adelie", number
                record[LABEL] = "Adelie "
            if number in LABEL_CASE_ROWS:
                assert record[LABEL] == "Gentoo", number
                record[LABEL] = "gentoo"
        records.append(record)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(NAMES)
        writer.writerows([[r[name] for name in NAMES] for r in records])
    return records


def line_of(row_number: int) -> str:
    """The CSV line of a 0-based data row (the header is line 1)."""
    return f"line {row_number + 2}"
