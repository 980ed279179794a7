"""A new user's own data, as real-world files come: one CSV the project has never seen, then
`init`, `run` as init wrote it (stopped), and `run` with the suggested options — once per session.

The CSV is made from the bundled penguins: their columns renamed and columns of noise added so
that one file holds the column-name cases of `NAMES` (slashes, spaces, parentheses, dots,
leading digits, CJK and accented letters, names that differ only in case, Python keywords, a
200-character name, names that read alike once sanitized, a column called "label"); a free-text
column; an identifier and a constant column (init drops both); missing cells, written empty and
as "NA"; and what spreadsheets and lab systems produce: decimal commas among decimal points in a
numeric column, and label values that differ only in whitespace or case.

Shared by tests/test_init.py (what init wrote, the model the run pushed), tests/test_progress.py
(what `run` showed while it ran) and tests/test_real_world_csv.py (names as written, dirty cells):
the pipeline runs once per pytest process however many tests read it.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import random
import time
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess

from fullthrottle import cli
from fullthrottle.core.bundled import bundled_path
from tests.helpers import run_cli

LABEL = "Species name/Art"
LONG_NAME = "measurement_" + "very_" * 40 + "long (200+ characters)"
TEXT = "field notes"  # free text: words that give the species away, and filler
ID = "record id"  # every value distinct: dropped by init
CONSTANT = "source"  # a single value: dropped by init
NA_COLUMN = "1st.flipper-length"  # its missing cells are written "NA" (the others empty)
# Every raw column, as written in the header. The penguins' own columns first.
RENAMED = {
    "species": LABEL,
    "island": "Island/Insel",
    "sex": "Sex (M/F)",
    "bill_length_mm": "bill length (mm)",
    "bill_depth_mm": "od280/od315_of_diluted_wines",
    "flipper_length_mm": NA_COLUMN,
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
NAMES = (*RENAMED.values(), *NOISE, TEXT, ID, CONSTANT)
NUMERIC = ("bill length (mm)", "od280/od315_of_diluted_wines", NA_COLUMN, "温度")
# Words that give the species away in the free-text column, plus filler shared by all.
SPECIES_WORDS = {
    "Adelie": ["pale", "rocky", "small", "noisy"],
    "Chinstrap": ["striped", "steep", "cliff", "strap"],
    "Gentoo": ["orange", "beak", "large", "swift"],
}
FILLER = ["the", "bird", "was", "and", "near", "nest", "seen", "again", "with", "its", "mate"]
# The cells `dirty=True` changes (0-based data rows), and how.
DECIMAL_COMMA_ROWS = (17, 60, 121, 200)
LABEL_SPACE_ROWS = (5, 40, 77)  # "Adelie" -> "Adelie "
LABEL_CASE_ROWS = (250, 260)  # "Gentoo" -> "gentoo"
TRAIN_STEPS = 200
# What `run` needs besides init's config: the options init suggested.
SUGGESTED = ("--set", "data.decimal=','", "--set", "data.near_duplicate_labels=merge")


def penguin_rows() -> list[dict[str, str]]:
    return list(csv.DictReader(bundled_path("palmerpenguins").read_text().splitlines()))


def write_own_data_csv(path: Path, *, dirty: bool = True, seed: int = 7) -> list[dict[str, str]]:
    """Writes the CSV; returns its rows as dicts keyed by the names as written."""
    rng = random.Random(seed)
    records = []
    for number, penguin in enumerate(penguin_rows()):
        missing = {old: "NA" if new == NA_COLUMN else "" for old, new in RENAMED.items()}
        record = {
            new: (missing[old] if penguin[old] == "NA" else penguin[old])
            for old, new in RENAMED.items()
        }
        for name, kind in NOISE.items():
            if kind == "n":
                record[name] = f"{rng.gauss(10, 3):.3f}"
            elif kind == "i":
                record[name] = str(rng.randint(0, 9))
            else:
                record[name] = rng.choice(["red", "green", "blue"])
        words = rng.sample(FILLER, 7) + [rng.choice(SPECIES_WORDS[penguin["species"]])]
        rng.shuffle(words)
        record[TEXT] = " ".join(words)
        record[ID] = f"r{number:05d}"
        record[CONSTANT] = "field station"
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


def complete(record: dict[str, str]) -> bool:
    """No cell of the row is missing (empty or "NA")."""
    return all(value not in ("", "NA") for value in record.values())


def line_of(row_number: int) -> str:
    """The CSV line of a 0-based data row (the header is line 1)."""
    return f"line {row_number + 2}"


def cli_in_process(*args: str, stdout: list[str] | None = None) -> tuple[int, str]:
    """`fullthrottle ARGS` in this process; exit status and everything it printed, one line.
    `stdout`, if given, receives what it printed on stdout alone."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    if stdout is not None:
        stdout.append(out.getvalue())
    return code, " ".join((out.getvalue() + err.getvalue()).split())


@dataclass(frozen=True)
class OwnDataRun:
    workdir: Path
    csv_path: Path
    config_path: Path
    records: list[dict[str, str]]
    init: tuple[int, str]  # exit status, what it printed (one line)
    init_stdout: str
    stopped_dir: Path
    stopped: tuple[int, str]  # `run` on init's config as written
    stopped_seconds: float
    output_dir: Path
    run: CompletedProcess  # `run` with the suggested options, a fresh process


@functools.cache
def own_data_run(base: str) -> OwnDataRun:
    """Acts as a new user: writes the CSV, `init`, `run` (stopped), `run` as suggested."""
    workdir = Path(base) / "own_data"
    workdir.mkdir(parents=True, exist_ok=True)
    csv_path = workdir / "export.csv"
    records = write_own_data_csv(csv_path)
    config_path = workdir / "export.yaml"
    printed: list[str] = []
    init = cli_in_process(
        "init", "--data", str(csv_path), "--label", LABEL, "--output", str(config_path),
        stdout=printed,
    )  # fmt: skip
    assert init[0] == 0, f"init failed: {init[1][-3000:]}"
    stopped_dir = workdir / "stopped"
    started = time.monotonic()
    stopped = cli_in_process("run", "--config", str(config_path), "--output-dir", str(stopped_dir))
    stopped_seconds = time.monotonic() - started
    output_dir = workdir / "runs"
    run = run_cli(
        "run", "--config", str(config_path), "--output-dir", str(output_dir), *SUGGESTED,
        "--set", f"training.train_steps={TRAIN_STEPS}",
        # Several loops, so the trainer's progress shows more than one line.
        "--set", "training.steps_per_loop=50",
        cwd=workdir,
    )  # fmt: skip
    return OwnDataRun(
        workdir=workdir,
        csv_path=csv_path,
        config_path=config_path,
        records=records,
        init=init,
        init_stdout=printed[0],
        stopped_dir=stopped_dir,
        stopped=stopped,
        stopped_seconds=stopped_seconds,
        output_dir=output_dir,
        run=run,
    )
