"""Finding, checking and staging the input data before any pipeline work starts.

`prepare_data` resolves bundled names, checks that the files exist, are not empty and have
every configured column, and writes a normalized copy of CSV input into the run's output folder
(cells equal to one of `na_values` become empty, which TFX's CSV decoder reads as missing),
already split: `train/data.csv` and `eval/data.csv`, stratified by label
(fullthrottle/core/splits.py), which ExampleGen reads as its two input splits. Each file is
rewritten only when its content changes, so an unchanged input keeps its file fingerprints and
the pipeline's cache stays valid. Parquet input (fullthrottle/core/parquet.py) is checked,
split the same way and staged as `train/data.parquet` and `eval/data.parquet` (the configured
columns, typed by the Parquet schema). Both are read as a stream (CSV row by row, Parquet in
record batches), twice: a first pass checks every row and keeps what the split needs of each
(`_SplitKeys`: 16 bytes), a second writes the split files. TFRecord input is read where it is and split by
ExampleGen's hash buckets; a class whose every record would land in eval stops the run here.
"""

from __future__ import annotations

import codecs
import csv
import filecmp
import gzip
import io
import os
import re
import shutil
import zlib
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullthrottle.core.bundled import bundled_path
from fullthrottle.core.config import (
    BUNDLED_DIABETES,
    BUNDLED_PENGUINS,
    BUNDLED_TEXT,
    Config,
    DataSpec,
)
from fullthrottle.core.data_checks import (
    Finding,
    LabelReport,
    NumberReport,
    check_header_names,
    looks_continuous,
    normalize_number,
    report,
    type_findings,
)
from fullthrottle.core.errors import DataError
from fullthrottle.core.paths import hidden_reason, missing_path_message
from fullthrottle.core.splits import (
    HASH_BUCKETS,
    SPLIT_FOLDERS,
    SPLITS,
    STRATIFIED,
    STRATIFIED_RANGE,
    SplitSummary,
    eval_mask,
    eval_rows_for,
    hash_split,
    name_classes,
    range_strata_array,
    row_key64,
)

STAGED_CSV = "data.csv"  # in each split's folder: <staged>/train/data.csv, <staged>/eval/data.csv
STAGED_PARQUET = "data.parquet"  # <staged>/train/data.parquet, <staged>/eval/data.parquet
STAGED_FILES = {"csv": STAGED_CSV, "parquet": STAGED_PARQUET}
CATEGORICAL_HINT = "Or, if the column holds categories, list it under `data.categorical`."


@dataclass(frozen=True)
class PreparedData:
    """Where the pipeline reads from, and what was found there."""

    input_base: str  # folder handed to ExampleGen
    source_files: tuple[str, ...]
    columns: tuple[str, ...]
    rows: int | None  # counted for CSV input
    split: SplitSummary | None = None  # rows per split and class


def source_files(spec: DataSpec) -> list[Path]:
    if spec.path in (BUNDLED_PENGUINS, BUNDLED_TEXT, BUNDLED_DIABETES):
        return [bundled_path(spec.path)]
    path = Path(spec.path)
    if not path.exists():
        kind = {
            "csv": "CSV file or a folder of CSV files",
            "parquet": "Parquet file or a folder of Parquet files",
        }.get(spec.format, "folder of TFRecord files")
        raise DataError(
            missing_path_message(
                path, "data path", f" (config field `data.path`); point it at a {kind}"
            )
        )
    if spec.format == "parquet":
        from fullthrottle.core.parquet import parquet_files

        return parquet_files(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise DataError(f"data folder {path} (config field `data.path`) has no files in it")
        return files
    return [path]


_CHUNK = 1 << 24  # bytes read at a time when checking a CSV file's bytes
_BATCH = 1 << 16  # Parquet rows read at a time
_ROW_GROUP = 1 << 18  # rows per row group of a staged Parquet file


def _check_csv_bytes(path: Path) -> None:
    """Refuses an empty file, one that is not UTF-8 (naming the line of the first bad byte) and
    one with NUL bytes, in that order, reading the file in chunks."""
    blank = True
    nul = False
    lines = 0  # newlines before the current chunk
    decoder = codecs.getincrementaldecoder("utf-8")()
    with path.open("rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                line = lines + chunk[: max(0, exc.start - pending)].count(b"\n") + 1
                raise DataError(
                    f"{path} is not UTF-8 text (bad byte at line {line}); re-save it as UTF-8"
                ) from None
            if not chunk:
                break
            blank = blank and not chunk.strip()
            nul = nul or b"\x00" in chunk
            lines += chunk.count(b"\n")
    if blank:
        raise DataError(f"{path} is empty: a CSV needs a header line and at least one row of data")
    if nul:
        raise DataError(f"{path} contains NUL bytes: it does not look like a CSV file")


def _csv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """The header as written (line 1), then the non-blank rows, each with the line it starts on;
    read one row at a time (`_check_csv_bytes` has checked the bytes)."""
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            raise DataError(
                f"{path} is empty: a CSV needs a header line and at least one row of data"
            ) from None
        # A malformed row is the user's to fix, not a stack trace.
        except csv.Error as exc:
            raise DataError(
                f"{path}, line {reader.line_num}: cannot read the header as CSV ({exc})"
            ) from None
        yield 1, header
        try:
            line = reader.line_num + 1
            for row in reader:
                if row and any(cell.strip() for cell in row):
                    yield line, row
                line = reader.line_num + 1
        except csv.Error as exc:
            # Python's csv reader (which TFX's CsvExampleGen also uses) refuses fields over
            # csv.field_size_limit() characters (131,072): stop here, naming the line.
            raise DataError(
                f"{path}, line {reader.line_num}: {exc}; a cell this long is not accepted by the "
                "CSV reader of ExampleGen either. Shorten or remove the value."
            ) from None


def _check_csv_header(
    spec: DataSpec, path: Path, raw_header: list[str], first: list[str] | None, files: list[Path]
) -> list[str]:
    """The header, stripped; refuses names no column can have, missing configured columns and a
    header that differs from the first file's (`first`)."""
    check_header_names(raw_header, source=str(path))
    header = [h.strip() for h in raw_header]
    _check_columns(spec, header, str(path))
    if first is not None and header != first:
        raise DataError(
            f"{path} has a different header from {files[0]}; all CSV files must share one header"
        )
    return header


class _RowChecks:
    """The value checks of staging, fed one row at a time: numbers as `data.decimal` and
    `data.thousands` write them in each of `numeric`, a regression label a number in every row,
    one spelling per label class (fullthrottle/core/data_checks.py)."""

    def __init__(self, spec: DataSpec, header: list[str], numeric: Sequence[str]) -> None:
        self.spec = spec
        self.numeric = [(header.index(c), NumberReport(c)) for c in numeric]
        self.index = header.index(spec.label)
        self.regression = spec.task == "regression"
        self.label_numbers = NumberReport(spec.label)
        self.labels = LabelReport(spec.label)
        self.unlabelled: list[str] = []  # the first places of rows without a regression label
        self.unlabelled_rows = 0

    def add(self, place: str, row: Sequence[str]) -> None:
        spec = self.spec
        for index, numbers in self.numeric:
            numbers.add(place, row[index], decimal=spec.decimal, thousands=spec.thousands)
        cell = row[self.index]
        if not self.regression:
            self.labels.add(place, cell)
            return
        self.label_numbers.add(place, cell, decimal=spec.decimal, thousands=spec.thousands)
        if not cell.strip():
            self.unlabelled_rows += 1
            if len(self.unlabelled) < 5:
                self.unlabelled.append(place)

    def check(self, *, source: str) -> None:
        """Raises one DataError with every finding."""
        findings = []
        for _, numbers in self.numeric:
            finding = numbers.finding(where="`data.numeric`", categorical_hint=CATEGORICAL_HINT)
            if finding is not None:
                findings.append(finding)
        if self.regression:
            findings += self._regression_label_findings()
        else:
            # "merge" merges them, "keep" keeps them: only "stop" stops.
            finding = self.labels.finding(mode=self.spec.near_duplicate_labels)
            if finding is not None and self.spec.near_duplicate_labels == "stop":
                findings.append(finding)
        if findings:
            raise DataError(report(findings, source=source))

    def _regression_label_findings(self) -> list[Finding]:
        """A regression label (`data.task: regression`) is a number in every row: the cells that
        are not numbers, and the rows without a label, as one finding naming their lines."""
        label = self.spec.label
        finding = self.label_numbers.finding(
            where="`data.label`",
            categorical_hint=(
                "If the label is a class rather than a number, set `data.task: classification`"
            ),
        )
        empty = self.unlabelled_rows
        if not empty:
            return [] if finding is None else [finding]
        shown = ", ".join(self.unlabelled) + (f" and {empty - 5} more" if empty > 5 else "")
        rows_word = "1 row has" if empty == 1 else f"{empty} rows have"
        missing = (
            f"{rows_word} no label value ({shown}), and a regression model learns only from rows "
            "with a number to predict"
        )
        fix = "Remove the rows without a label or fill them in."
        if finding is None:
            return [Finding(label, "`data.label`", missing, fix)]
        return [
            Finding(label, "`data.label`", f"{finding.problem}; {missing}", f"{finding.fix} {fix}")
        ]

    def merges(self) -> dict[str, str]:
        """Spelling -> class, when `data.near_duplicate_labels` is "merge" (else none)."""
        if self.spec.near_duplicate_labels == "merge" and not self.regression:
            return self.labels.merges()
        return {}

    def check_classes(self, *, rows: int, files: list[Path]) -> None:
        """A classifier needs two classes; one label value throughout is a wrong file or filter."""
        if self.regression:  # numbers, checked above
            return
        spellings = self.labels.spellings
        merges = self.merges()
        classes = {merges.get(value, value) for value in spellings}
        label = self.spec.label
        if len(classes) < 2:
            found = f"the single value {next(iter(classes))!r}" if classes else "no values at all"
            raise DataError(
                f"the label column {label!r} (config field `data.label`) of "
                f"{', '.join(map(str, files))} has {found} in {rows} rows: a classifier needs at "
                "least two classes. Check the file (a filtered export?) or the label column."
            )
        present = sum(spellings.values())
        if looks_continuous(len(classes), present):
            raise DataError(
                f"the label column {label!r} (config field `data.label`) of "
                f"{', '.join(map(str, files))} has {len(classes)} distinct values in {present} "
                "rows: too many to be classes (it looks continuous or like an identifier). If it "
                "is a number to predict, set `data.task: regression` and `evaluation.max_mae`; "
                "otherwise bucket it into classes first, or pick another label column."
            )


_WHOLE_NUMBER = re.compile(r"\s*[+-]?\d+\s*")


def _cell_normalizer(spec: DataSpec, header: list[str]) -> Callable[[list[str]], None]:
    """Rewrites a checked row in place: plain decimals in numeric columns.

    A numeric cell is written as a plain decimal (`data.decimal`, `data.thousands` applied), a
    whole number with ".0": CsvExampleGen infers a column of whole numbers as INT, and the model
    would then take only integers for a measurement that happened to be whole in the sample
    ("215.0" refused where "215" is taken). Written this way every numeric column is FLOAT."""
    # A regression label is a number too.
    regression_label = (spec.label,) if spec.task == "regression" else ()
    indices = [header.index(c) for c in (*spec.numeric, *regression_label)]
    convert = spec.decimal != "." or bool(spec.thousands)

    def normalize(row: list[str]) -> None:
        for index in indices:
            cell = row[index]
            if not cell.strip():
                continue
            if convert:
                plain = normalize_number(cell, decimal=spec.decimal, thousands=spec.thousands)
                cell = cell if plain is None else plain
            if _WHOLE_NUMBER.fullmatch(cell):
                cell = cell.strip() + ".0"
            row[index] = cell

    return normalize


class _SplitKeys:
    """What the split needs of each row, a few bytes whatever its width: its stratum (a class
    number, or a regression label's value) and `row_key64`."""

    def __init__(self, spec: DataSpec) -> None:
        self.regression = spec.task == "regression"
        self.keys = array("Q")
        self.values = array("d") if self.regression else array("l")
        self.classes: dict[str, int] = {}

    def add(self, label: str, cells: Sequence[str]) -> None:
        self.keys.append(row_key64(cells))
        if self.regression:
            try:
                self.values.append(float(label))
            except ValueError:  # refused by the checks before the split is made
                self.values.append(float("nan"))
        else:
            self.values.append(self.classes.setdefault(label, len(self.classes)))

    def __len__(self) -> int:
        return len(self.keys)


def _split_rows(spec: DataSpec, keys: _SplitKeys, *, source: str) -> tuple[Any, SplitSummary]:
    """Each row's split (a boolean array, True for eval), stratified by its label (a regression
    label by ranges of its sorted values), and the summary; data too small to give eval a row
    is refused."""
    import numpy as np

    buckets = {"train_buckets": spec.train_buckets, "eval_buckets": spec.eval_buckets}
    values = np.frombuffer(keys.values, dtype=np.float64 if keys.regression else np.int_)
    strata = range_strata_array(values, **buckets) if keys.regression else values
    mask = eval_mask(strata, np.frombuffer(keys.keys, dtype=np.uint64), **buckets)
    names = (
        [f"range {n}" for n in range(int(strata.max()) + 1 if len(strata) else 0)]
        if keys.regression
        else list(keys.classes)
    )
    evals = np.bincount(strata[mask], minlength=len(names))
    totals = np.bincount(strata, minlength=len(names))
    split = SplitSummary(
        method=STRATIFIED_RANGE if keys.regression else STRATIFIED,
        label=spec.label,
        class_rows={
            names[n]: {"train": int(totals[n] - evals[n]), "eval": int(evals[n])}
            for n in sorted(range(len(names)), key=names.__getitem__)
        },
        classes=not keys.regression,
    )
    if not split.rows("eval"):
        raise DataError(_no_eval_rows_message(spec, source=source, rows=len(keys)))
    return mask, split


def _flags(mask: Any) -> Iterator[bool]:
    """The values of a boolean array, a block at a time (not one Python list of all rows)."""
    for start in range(0, len(mask), _BATCH):
        yield from mask[start : start + _BATCH].tolist()


def _prepare_csv(spec: DataSpec, files: list[Path], staged_dir: Path) -> PreparedData:
    """Checks CSV input and stages it, split, reading one row at a time: a first pass checks
    every row and keeps what the split needs (`_SplitKeys`), a second writes the split files."""
    _refuse_parquet_as_csv(files)
    header0: list[str] | None = None
    na = set(spec.na_values)
    checks: _RowChecks | None = None
    normalize: Callable[[list[str]], None] | None = None
    keys = _SplitKeys(spec)
    for path in files:
        _check_csv_bytes(path)
        rows = _csv_rows(path)
        raw_header = next(rows)[1]
        try:  # refused below, in order, once the whole file has been read
            header = _check_csv_header(spec, path, raw_header, header0, files)
            header_ok = len(raw_header) >= 2
        except DataError:
            header, header_ok = [h.strip() for h in raw_header], False
        if header_ok and checks is None:
            checks = _RowChecks(spec, header, spec.numeric)
            normalize = _cell_normalizer(spec, header)
            label_index = header.index(spec.label)
        prefix = f"{path.name} " if len(files) > 1 else ""
        problem: str | None = None  # the first row the file cannot be read from
        count = 0
        for line_no, row in rows:
            count += 1
            if problem is not None or not header_ok:
                continue
            if len(row) != len(header):
                problem = (
                    f"{path}, line {line_no}: {len(row)} fields where the header has "
                    f"{len(header)}; fix the row"
                )
                continue
            if [cell.strip() for cell in row] == header:
                problem = (
                    f"{path}, line {line_no}: the header line appears again inside the data; "
                    "remove it"
                )
                continue
            cells = ["" if cell in na else cell for cell in row]
            checks.add(f"{prefix}line {line_no}", cells)  # type: ignore[union-attr]
            normalize(cells)  # type: ignore[misc]
            keys.add(cells[label_index], cells)
        if len(raw_header) < 2 and count > 0:
            raise DataError(
                f"{path} has a single column {raw_header[0]!r}: is the delimiter something other "
                "than a comma? fullthrottle reads comma-separated files; convert it first."
            )
        header = _check_csv_header(spec, path, raw_header, header0, files)
        if problem is not None:
            raise DataError(problem)
        if header0 is None:
            header0 = header
    assert header0 is not None and checks is not None and normalize is not None
    if not len(keys):
        raise DataError(f"{files[0]} has a header but no rows of data")
    source = str(files[0]) if len(files) == 1 else f"{spec.path} ({len(files)} files)"
    checks.check(source=source)
    checks.check_classes(rows=len(keys), files=files)
    merges = checks.merges()

    def staged_rows() -> Iterator[list[str]]:
        for path in files:
            rows = _csv_rows(path)
            next(rows)
            for _, row in rows:
                cells = ["" if cell in na else cell for cell in row]
                normalize(cells)
                if merges:
                    cells[label_index] = merges.get(cells[label_index], cells[label_index])
                yield cells

    if merges:  # the merged labels are part of each row's key: computed again
        keys = _SplitKeys(spec)
        for cells in staged_rows():
            keys.add(cells[label_index], cells)
    mask, split = _split_rows(spec, keys, source=source)

    def write(targets: dict[str, Path]) -> None:
        with ExitStack() as stack:
            writers = {}
            for name, target in targets.items():
                f = stack.enter_context(target.open("w", encoding="utf-8", newline=""))
                # The header line as CsvExampleGen reads it: split at commas, quotes not read (a
                # name with a quote character stays as it is; names with commas were refused).
                f.write(",".join(header0) + "\n")
                writers[name] = csv.writer(f, lineterminator="\n")
            train, eval_ = writers["train"], writers["eval"]
            for to_eval, cells in zip(_flags(mask), staged_rows(), strict=True):
                (eval_ if to_eval else train).writerow(cells)

    _write_staged_files(staged_dir, write, STAGED_CSV)
    return PreparedData(str(staged_dir), tuple(map(str, files)), tuple(header0), len(keys), split)


def _check_columns(spec: DataSpec, header: list[str], where: str) -> None:
    missing_label = spec.label not in header
    missing = [c for c in spec.feature_columns if c not in header]
    if missing_label:
        raise DataError(
            f"{where} has no label column {spec.label!r} (config field `data.label`); its columns are: "
            f"{', '.join(header)}. Set `data.label` to one of them."
        )
    if missing:
        fields = []
        for name in missing:
            kind = (
                "numeric"
                if name in spec.numeric
                else "categorical"
                if name in spec.categorical
                else "text"
            )
            fields.append(f"{name!r} (in `data.{kind}`)")
        raise DataError(
            f"{where} has no column {', '.join(fields)}; its columns are: {', '.join(header)}. "
            "Fix the config or the file."
        )


def _refuse_parquet_as_csv(files: list[Path]) -> None:
    """A Parquet file under `data.format: csv` (e.g. `run --data x.parquet` with a CSV config)."""
    from fullthrottle.core.parquet import MAGIC

    for path in files:
        with path.open("rb") as f:
            magic = f.read(4)
        if magic == MAGIC:
            raise DataError(
                f"{path} is a Parquet file, but `data.format` is 'csv'; set `data.format: "
                "parquet` (e.g. --set data.format=parquet, or write the config with "
                "`fullthrottle init --data` on it)."
            )


def _no_eval_rows_message(spec: DataSpec, *, source: str, rows: int) -> str:
    needed = next(
        count
        for count in range(2, 2 * (spec.train_buckets + spec.eval_buckets) + 2)
        if eval_rows_for(count, train_buckets=spec.train_buckets, eval_buckets=spec.eval_buckets)
    )
    return (
        f"{source}: no class of the label {spec.label!r} has enough rows to give one to the eval "
        f"split ({rows} rows in all; with `data.train_buckets` {spec.train_buckets} : "
        f"`data.eval_buckets` {spec.eval_buckets} a class needs {needed} rows), so the model "
        "could not be evaluated. Add rows, or give eval a larger share with `data.eval_buckets`."
    )


def _check_parquet_types(spec: DataSpec, schema: object, source: str) -> None:
    """Every configured column of a type fullthrottle reads, numbers where numbers are needed;
    all problems in one message."""
    from fullthrottle.core.parquet import FLOAT, INT, kind_of, unsupported_reason

    findings = []
    numbers = (*spec.numeric, *((spec.label,) if spec.task == "regression" else ()))
    for column in spec.all_columns:
        arrow_type = schema.field(column).type  # type: ignore[attr-defined]
        where = "`data.label`" if column == spec.label else _listed_in(spec, column)
        kind = kind_of(arrow_type)
        if kind is None:
            findings.append(
                Finding(
                    column,
                    where,
                    f"its {unsupported_reason(arrow_type)}",
                    "Or remove it from the config.",
                )
            )
        elif column in numbers and kind not in (INT, FLOAT):
            findings.append(
                Finding(
                    column,
                    where,
                    f"a number is needed, but its Parquet type is {arrow_type}",
                    "Cast the column to a number type when writing the file"
                    + (
                        ", or set `data.task: classification`."
                        if column == spec.label
                        else f". {CATEGORICAL_HINT}"
                    ),
                )
            )
    if findings:
        raise DataError(report(findings, source=source))


def _listed_in(spec: DataSpec, column: str) -> str:
    if column in spec.numeric:
        return "`data.numeric`"
    if column in spec.categorical:
        return "`data.categorical`"
    return "`data.text`"


def _prepare_parquet(spec: DataSpec, files: list[Path], staged_dir: Path) -> PreparedData:
    """Checks Parquet input and stages its configured columns, split as CSV input is split,
    reading `_BATCH` rows at a time: a first pass checks the label's cells and keeps what the
    split needs, a second writes the split files."""
    from fullthrottle.core import parquet

    source = str(files[0]) if len(files) == 1 else f"{spec.path} ({len(files)} files)"
    schema = parquet.common_schema(files)
    parquet.check_not_empty(files, where=source)
    header = list(schema.names)
    _check_columns(spec, header, source)
    _check_parquet_types(spec, schema, source)
    wanted = set(spec.all_columns)
    columns = [name for name in header if name in wanted]
    index = columns.index(spec.label)
    # The types are the file's: only the label's cells need the checks CSV cells get.
    checks = _RowChecks(spec, columns, ())
    keys = _SplitKeys(spec)
    for path, number, batch in parquet.iter_batches(files, columns, _BATCH):
        prefix = f"{path.name} " if len(files) > 1 else ""
        data = [
            [parquet.cell_text(v) for v in batch.column(i).to_pylist()] for i in range(len(columns))
        ]
        for offset, cells in enumerate(zip(*data, strict=True)):
            checks.add(f"{prefix}row {number + offset}", cells)
            keys.add(cells[index], cells)
    checks.check(source=source)
    merges = checks.merges()
    checks.check_classes(rows=len(keys), files=files)

    def merged(batch: Any) -> Any:
        if not merges:
            return batch
        import pyarrow as pa

        labels = batch.column(index).to_pylist()
        return batch.set_column(
            index,
            spec.label,
            pa.array(
                [merges.get(v, v) if isinstance(v, str) else v for v in labels],
                type=batch.schema.field(index).type,
            ),
        )

    if merges:  # the merged labels are part of each row's key: computed again
        keys = _SplitKeys(spec)
        for _, _, batch in parquet.iter_batches(files, columns, _BATCH):
            batch = merged(batch)
            data = [
                [parquet.cell_text(v) for v in batch.column(i).to_pylist()]
                for i in range(len(columns))
            ]
            for cells in zip(*data, strict=True):
                keys.add(cells[index], cells)
    mask, split = _split_rows(spec, keys, source=source)

    def write(targets: dict[str, Path]) -> None:
        import pyarrow as pa

        writers = parquet.StagedWriters(targets, _ROW_GROUP)
        start = 0
        for _, _, batch in parquet.iter_batches(files, columns, _BATCH):
            to_eval = pa.array(mask[start : start + batch.num_rows])
            start += batch.num_rows
            batch = merged(batch)
            writers.write("eval", batch.filter(to_eval))
            writers.write("train", batch.filter(pa.compute.invert(to_eval)))
        writers.close()

    _write_staged_files(staged_dir, write, STAGED_PARQUET)
    return PreparedData(str(staged_dir), tuple(map(str, files)), tuple(header), len(keys), split)


def _write_staged_files(
    staged_dir: Path, write: Callable[[dict[str, Path]], None], file_name: str
) -> None:
    """Writes `<split>/<file_name>` for each split: `write` writes them to the paths it is given,
    and each replaces the staged file only when its content changed (an unchanged file keeps
    its fingerprint, and ExampleGen's cache stays valid). Anything else in the folder goes."""
    staged_dir.mkdir(parents=True, exist_ok=True)
    targets = {}
    for name in SPLITS:
        folder = staged_dir / name
        if folder.exists() and not folder.is_dir():
            folder.unlink()
        folder.mkdir(exist_ok=True)
        targets[name] = (folder / file_name).with_suffix(".tmp")
    write(targets)
    for name, tmp in targets.items():
        target = staged_dir / name / file_name
        if target.exists() and filecmp.cmp(tmp, target, shallow=False):
            tmp.unlink()
        else:
            os.replace(tmp, target)
        for stale in target.parent.iterdir():
            if stale.name != file_name:
                _remove(stale)
    for stale in staged_dir.iterdir():
        if stale.name not in targets:
            _remove(stale)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _scan_tfrecords(files: list[Path], spec: DataSpec) -> SplitSummary:
    """Reads every record of every file: a truncated or corrupted file stops here, named. Counts
    each label value in the split ExampleGen's hash buckets give its record."""
    import tensorflow as tf

    pairs: Counter[tuple[str, str]] = Counter()
    for path in files:
        with open(path, "rb") as f:
            compression = "GZIP" if f.read(2) == b"\x1f\x8b" else ""
        count = 0
        try:
            dataset = tf.data.TFRecordDataset([str(path)], compression_type=compression)
            for record in dataset.as_numpy_iterator():
                features = tf.train.Example.FromString(record).features.feature
                split = hash_split(
                    record, train_buckets=spec.train_buckets, eval_buckets=spec.eval_buckets
                )
                value = "all" if spec.task == "regression" else _first_value(features, spec.label)
                pairs[value, split] += 1
                count += 1
        except Exception as exc:  # noqa: BLE001 - DataLossError and friends: all mean a damaged file
            detail = (
                str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            )
            kind = "gzip-compressed TFRecord" if compression else "TFRecord"
            raise DataError(
                f"{path} is a damaged {kind} file (truncated or corrupted: {detail}); "
                "re-export it or remove it from the data folder"
            ) from None
        if count == 0:
            raise DataError(f"{path} holds no records; remove it from the data folder")
    return SplitSummary.count(
        method=HASH_BUCKETS,
        label=spec.label,
        pairs=(pair for pair, count in pairs.items() for _ in range(count)),
        classes=spec.task != "regression",
    )


def _check_tfrecord_split(spec: DataSpec, split: SplitSummary, folder: Path) -> None:
    """A class with eval records and no train records would be unknown to the label vocabulary
    (analyzed over train) and fail the evaluation after training: stop before any component."""
    unseen = split.not_trained
    if not unseen:
        return
    several = len(unseen) != 1
    raise DataError(
        f"the TFRecord data in {folder} (config field `data.path`) is split by ExampleGen's hash "
        f"buckets (`data.train_buckets` {spec.train_buckets} : `data.eval_buckets` "
        f"{spec.eval_buckets}), which put every record of {len(unseen)} class"
        f"{'es' if several else ''} of the label {spec.label!r} into the eval split: "
        f"{name_classes(unseen)}. The model would never learn {'them' if several else 'it'} "
        "and the evaluation would fail on them after training. Add records of these classes, "
        "remove them, or export the data as CSV, which `fullthrottle run` splits stratified by "
        "label (every class keeps a row in train)."
    )


def _check_schema_file(spec: DataSpec) -> None:
    """`data.schema_path` must name a readable schema.pbtxt that describes the label."""
    if not spec.schema_path:
        return
    path = Path(spec.schema_path)
    if not path.is_file():
        raise DataError(
            missing_path_message(
                path,
                "schema file",
                " (config field `data.schema_path`); write one with "
                "`fullthrottle schema --data ... --output schema.pbtxt`",
            )
        )
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    try:
        schema = text_format.Parse(path.read_text(encoding="utf-8"), schema_pb2.Schema())
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise DataError(
            f"schema file {path} (config field `data.schema_path`) is not a text-format TFMD "
            f"Schema: {exc}"
        ) from None
    names = {feature.name for feature in schema.feature}
    missing = [c for c in spec.all_columns if c not in names]
    if missing:
        raise DataError(
            f"schema file {path} (config field `data.schema_path`) does not describe the "
            f"configured column(s) {', '.join(map(repr, missing))}; add them to the schema"
        )
    types = {f.name: schema_pb2.FeatureType.Name(f.type) for f in schema.feature}
    findings = type_findings(spec.numeric, types)
    if findings:
        raise DataError(report(findings, source=f"schema file {path} (`data.schema_path`)"))
    whole = [c for c in spec.numeric if types.get(c) == "INT"]
    if whole and spec.format == "csv":
        raise DataError(
            f"schema file {path} (config field `data.schema_path`) types the numeric column(s) "
            f"{', '.join(map(repr, whole))} as INT, but `fullthrottle run` writes the cells of "
            "`data.numeric` columns as decimals (a measurement is a number, whole or not), which "
            "ExampleGen reads as FLOAT. In the schema, change their `type: INT` to `type: FLOAT` "
            "and any `int_domain` to `float_domain` (or regenerate it with `fullthrottle schema`), "
            "or list an integer id column under `data.categorical`."
        )


def _prepare_tfrecord(spec: DataSpec, files: list[Path]) -> PreparedData:
    import tensorflow as tf

    first = files[0]
    with first.open("rb") as f:  # enough to tell a small damaged gzip file
        data = f.read((1 << 20) + 1)
    if not data:
        raise DataError(f"{first} is empty: a TFRecord file needs at least one record")
    compression = "GZIP" if data[:2] == b"\x1f\x8b" else None
    if compression:
        try:
            gzip.decompress(data[: 1 << 20]) if len(data) <= 1 << 20 else None
        except (OSError, EOFError, zlib.error):  # zlib.error: a damaged deflate stream
            raise DataError(
                f"{first} looks gzip-compressed but is corrupted; re-export it"
            ) from None
    try:
        record = next(
            iter(tf.data.TFRecordDataset([str(first)], compression_type=compression or ""))
        )
        example = tf.train.Example.FromString(record.numpy())
    except Exception as exc:  # noqa: BLE001 - TF raises DataLossError and friends; all mean bad input
        raise DataError(
            f"{first} is not a readable TFRecord file of tf.Example records: {exc}"
        ) from None
    header = list(example.features.feature.keys())
    _check_columns(spec, header, str(first))
    parent = first.parent if Path(spec.path).is_dir() else None
    if parent is None:
        raise DataError(
            f"`data.path` must be a folder of TFRecord files for format 'tfrecord', got the file {first}"
        )
    split = _scan_tfrecords(files, spec)
    _check_tfrecord_split(spec, split, parent)
    rows = split.rows("train") + split.rows("eval")
    return PreparedData(str(parent), tuple(map(str, files)), tuple(header), rows, split)


def prepare_data(config: Config) -> PreparedData:
    """Checks the configured data and stages it for ExampleGen; raises `DataError` when unusable."""
    spec = config.data
    hidden = hidden_reason(config.output_path)
    if hidden is not None:
        # Written inside the userland, the outputs would be lost with it, not on the host.
        raise DataError(f"the output folder (`output_dir`) cannot be used: {hidden}")
    _check_schema_file(spec)
    files = source_files(spec)
    if spec.format == "tfrecord":
        return _prepare_tfrecord(spec, files)
    if spec.format == "parquet":
        return _prepare_parquet(spec, files, config.staged_data_dir)
    return _prepare_csv(spec, files, config.staged_data_dir)


def read_input_cells(
    input_base: str, *, data_format: str, columns: list[str]
) -> dict[str, list[tuple[str, str]]]:
    """`(place, cell)` pairs of `columns` in the data ExampleGen read from `input_base`, as
    `input_rows` reads them."""
    cells: dict[str, list[tuple[str, str]]] = {column: [] for column in columns}
    for place, values in input_rows(input_base, data_format=data_format, columns=columns):
        for column in columns:
            cells[column].append((place, values[column]))
    return cells


def input_rows(
    input_base: str, *, data_format: str, columns: list[str]
) -> Iterator[tuple[str, dict[str, str]]]:
    """`(place, column -> cell)` for each row of the data ExampleGen read from `input_base`,
    one file (a Parquet file `_BATCH` rows) at a time.

    For the DataGate, on any runner (tf.io.gfile reads local paths and object stores alike).
    CSV: every file of the split folders ExampleGen reads (`train/`, `eval/`), its header split
    as CsvExampleGen splits it (at commas), places "train/data.csv line 7". Parquet: every file
    of the split folders, places "train/data.parquet row 7". TFRecord: every record of every
    file in the folder, places "part-0.gz record 3"; numbers are written as text, bytes decoded
    as UTF-8. A missing cell or feature is "".
    """
    import tensorflow as tf

    # (the prefix of the places, the folder)
    folders = (
        [(f"{split}/", os.path.join(input_base, split)) for split in SPLITS]
        if data_format in ("csv", "parquet")
        else [("", input_base)]
    )
    files = [
        (prefix + os.path.basename(path), path)
        for prefix, folder in folders
        for path in sorted(tf.io.gfile.glob(os.path.join(folder, "*")))
        if not os.path.basename(path).startswith(".") and not tf.io.gfile.isdir(path)
    ]
    for name, path in files:
        if data_format == "parquet":
            yield from _parquet_cells(path, name, columns)
            continue
        if data_format == "csv":
            with tf.io.gfile.GFile(path, "r") as f:
                header = f.readline().rstrip("\r\n").split(",")
                reader = csv.reader(f)
                line = 2
                for row in reader:
                    if row and any(cell.strip() for cell in row) and len(row) == len(header):
                        values = dict(zip(header, row, strict=True))
                        yield (
                            f"{name} line {line}",
                            {column: values.get(column, "") for column in columns},
                        )
                    line = reader.line_num + 2
            continue
        with tf.io.gfile.GFile(path, "rb") as f:
            compression = "GZIP" if f.read(2) == b"\x1f\x8b" else ""
        dataset = tf.data.TFRecordDataset([path], compression_type=compression)
        for number, record in enumerate(dataset.as_numpy_iterator(), start=1):
            features = tf.train.Example.FromString(record).features.feature
            yield (
                f"{name} record {number}",
                {column: _first_value(features, column) for column in columns},
            )


def input_label_splits(
    input_base: str, *, spec: DataSpec, label_cells: list[tuple[str, str]] | None = None
) -> SplitSummary:
    """The label's rows per class and split in the data ExampleGen read from `input_base`: the
    split folders of CSV input, ExampleGen's hash split of TFRecord input (for the DataGate, which
    also sees data that `fullthrottle run` did not stage, such as a Kubeflow input folder).

    `label_cells`: the label's cells of CSV or Parquet input as `read_input_cells` gave them,
    when the caller has read them already (the files are then not read again)."""
    if spec.format in ("csv", "parquet"):
        if label_cells is None:
            label_cells = read_input_cells(
                input_base, data_format=spec.format, columns=[spec.label]
            )[spec.label]
        return SplitSummary.count(
            method=SPLIT_FOLDERS,
            label=spec.label,
            pairs=((value, place.split("/", 1)[0]) for place, value in label_cells),
        )
    import tensorflow as tf

    pairs: Counter[tuple[str, str]] = Counter()
    for path in sorted(tf.io.gfile.glob(os.path.join(input_base, "*"))):
        if os.path.basename(path).startswith(".") or tf.io.gfile.isdir(path):
            continue
        with tf.io.gfile.GFile(path, "rb") as f:
            compression = "GZIP" if f.read(2) == b"\x1f\x8b" else ""
        dataset = tf.data.TFRecordDataset([path], compression_type=compression)
        for record in dataset.as_numpy_iterator():
            features = tf.train.Example.FromString(record).features.feature
            split = hash_split(
                record, train_buckets=spec.train_buckets, eval_buckets=spec.eval_buckets
            )
            pairs[_first_value(features, spec.label), split] += 1
    return SplitSummary.count(
        method=HASH_BUCKETS,
        label=spec.label,
        pairs=(pair for pair, count in pairs.items() for _ in range(count)),
    )


def _parquet_cells(
    path: str, name: str, columns: list[str]
) -> Iterator[tuple[str, dict[str, str]]]:
    """("train/data.parquet row 7", column -> cell text) for each row of a Parquet file, read
    `_BATCH` rows at a time (a local file; one in an object store is fetched whole); a column
    the file lacks is "" throughout."""
    import pyarrow.parquet as pq
    import tensorflow as tf

    from fullthrottle.core.parquet import cell_text

    if "://" in path:  # an object store: the file's bytes, through tf.io.gfile
        with tf.io.gfile.GFile(path, "rb") as f:
            source: Any = io.BytesIO(f.read())
    else:
        source = path
    parquet_file = pq.ParquetFile(source)
    present = [c for c in columns if c in parquet_file.schema_arrow.names]
    number = 1
    for batch in parquet_file.iter_batches(batch_size=_BATCH, columns=present):
        data = {c: batch.column(c).to_pylist() for c in present}
        for offset in range(batch.num_rows):
            yield (
                f"{name} row {number + offset}",
                {c: cell_text(data[c][offset]) if c in data else "" for c in columns},
            )
        number += batch.num_rows


def _first_value(features: object, column: str) -> str:
    if column not in features:  # type: ignore[operator]
        return ""
    feature = features[column]  # type: ignore[index]
    kind = feature.WhichOneof("kind")
    values = list(getattr(feature, kind).value) if kind else []
    if not values:
        return ""
    value = values[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else repr(value)
