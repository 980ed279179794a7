"""Column inference for `fullthrottle init`: what kind of feature each column of a sample is.

Owns: reading a sample (the first `sample_rows` rows of a CSV file or of Parquet files, or
records of a TFRecord folder), deciding per column, and explaining each decision in one line. Refuses (with a
`DataError` naming the file and column): a file that is not comma-separated UTF-8 text, a label
column that is not in the data, a label with a single value (nothing to learn), a label of text
with so many distinct values that it looks like an identifier, a label forced to regression that
is not numbers, and data with no usable feature left.

The label's task (`label_task`): numbers with fractions, or many distinct numbers (more than
1,000; or more than 50 that are at least 5% of the labelled rows or whole numbers spread over a
range twice their count), are a regression target; anything else is classes. `--task` overrides
it.

The heuristics, in order (the same text is in docs/own-data.md):

1. A cell is missing when it is empty or one of `NA_CANDIDATES` ("NA", "N/A", "null", ...).
2. A column with no present value in the sample, or a single distinct value, is dropped with a
   note (there is nothing to learn from it). For the label this is an error.
3. numeric: every present cell parses as a number (CSV), the values are float/int lists
   (TFRecord), or the column's Parquet type is an integer, float or boolean (Parquet; a column
   of another Parquet type than these and strings is dropped with its type named). A column of numbers except a few cells, or of numbers in another notation
   (`fullthrottle.core.data_checks.NUMBER_LIKE_FRACTION`), is numeric too and reported as a
   finding (the cells, their lines, the fix), as are label values written several ways: init
   asks instead of guessing, and `run` stops on them until they are decided.
4. text: named with `--text`, or strings that are long (median length >= 30 characters) or
   sentence-like (median >= 3 whitespace-separated words and >= 50% distinct values). The
   median is the typical value: a few huge cells do not make a column of short values text.
   Cells far longer than the column's typical value (`OUTLIER_LENGTH_FACTOR` times its median
   and at least `OUTLIER_MIN_LENGTH` characters) are reported with their lines.
   The tokenizer is "char" when at least 20% of the values contain CJK characters (written
   without spaces between words), else "word".
5. A string column whose values are all distinct and short is dropped: it looks like an
   identifier, and an identifier's vocabulary would only memorize rows.
6. categorical: every other string column.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fullthrottle.core.data_checks import (
    Finding,
    check_header_names,
    inspect_labels,
    inspect_numbers,
    looks_continuous,
)
from fullthrottle.core.errors import DataError
from fullthrottle.core.paths import missing_path_message

DEFAULT_SAMPLE_ROWS = 20_000
# How a number-like column that init listed under `data.numeric` is declared categories instead.
MOVE_HINT = "Or, if the column holds categories, move it to `data.categorical`."
# Cells that mean "missing" in real CSVs. Only the ones seen in the sample go into the config.
NA_CANDIDATES = ("NA", "N/A", "n/a", "NaN", "nan", "null", "NULL", "None", "?")
TEXT_MIN_MEDIAN_LENGTH = 30
TEXT_MIN_MEDIAN_WORDS = 3
# A cell this many times longer than its column's median length, and at least this long, is an
# outlier: reported with its line (often an unbalanced quote that merged rows into one cell).
OUTLIER_LENGTH_FACTOR = 10
OUTLIER_MIN_LENGTH = 200
OUTLIERS_SHOWN = 3
TEXT_MIN_DISTINCT_FRACTION = 0.5
# Share of text values containing CJK characters from which the char tokenizer is chosen.
CJK_CHAR_TOKENIZER_FRACTION = 0.2
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrecord.gz", ".gz", ".tfr")


@dataclass(frozen=True)
class TextSettings:
    """What `init` proposes for one text column (fields of `fullthrottle.core.config.TextColumn`)."""

    name: str
    tokenizer: str
    max_tokens: int
    vocab_size: int


@dataclass(frozen=True)
class ColumnReport:
    """One column's decision and the evidence for it, for the comments in the written config."""

    name: str
    kind: str  # "label" | "numeric" | "categorical" | "text" | "dropped"
    reason: str
    present: int
    missing: int
    distinct: int


@dataclass(frozen=True)
class Inference:
    """The result of reading a sample: ready to be written as a `DataSpec`."""

    path: Path
    format: str  # "csv" | "tfrecord" | "parquet"
    source_file: Path  # the file the sample came from
    rows_sampled: int
    label: str
    label_classes: tuple[tuple[str, int], ...]  # (value, count), most frequent first
    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    text: tuple[TextSettings, ...]
    dropped: tuple[ColumnReport, ...]
    na_values: tuple[str, ...]
    columns: tuple[ColumnReport, ...] = field(default_factory=tuple)
    # Columns and labels that need the user's decision (dirty numbers, near-duplicate labels).
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    # "classification" or "regression" (`data.task`), and why (`label_task`).
    task: str = "classification"
    task_reason: str = ""
    # Regression: the mean absolute error of always answering the sample's median label (the
    # trivial model's error, from which init sets `evaluation.max_mae`).
    median_mae: float | None = None

    @property
    def majority_fraction(self) -> float:
        """Share of the most frequent class among labelled rows (the trivial baseline's accuracy)."""
        total = sum(count for _, count in self.label_classes)
        return self.label_classes[0][1] / total if total else 0.0

    def report(self, name: str) -> ColumnReport:
        return next(c for c in self.columns if c.name == name)


# --- reading a sample -----------------------------------------------------------------------
def _read_csv_sample(path: Path, sample_rows: int) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, the first `sample_rows` data rows and where each starts ("line 7"); refuses files
    that are not CSV text and header names no column can have."""
    with path.open("rb") as f:
        head = f.read(1 << 16)
    if not head.strip():
        raise DataError(f"{path} is empty: a CSV needs a header line and at least one row of data")
    if b"\x00" in head:
        raise DataError(
            f"{path} contains NUL bytes: it is a binary file, not a CSV. Point --data at a "
            "comma-separated text file (or a folder of TFRecord files)."
        )
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the 64 KiB boundary is fine; anything earlier is not.
        if exc.start < len(head) - 4:
            line = head[: exc.start].count(b"\n") + 1
            raise DataError(
                f"{path} is not UTF-8 text (bad byte at line {line}): it is not a CSV file "
                "fullthrottle can read. Re-save it as UTF-8 CSV."
            ) from None
    rows: list[list[str]] = []
    places: list[str] = []
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            raw_header = next(reader, None)
            if raw_header is None:
                raise DataError(f"{path} is empty: a CSV needs a header line and at least one row")
            header = [h.strip() for h in raw_header]
            line = reader.line_num + 1
            for row in reader:
                start, line = line, reader.line_num + 1
                if not row or not any(cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise DataError(
                        f"{path}, line {start}: {len(row)} fields where the header has "
                        f"{len(header)}. Is this a comma-separated file? Fix the row or convert "
                        "the file to CSV."
                    )
                rows.append(row)
                places.append(f"line {start}")
                if len(rows) >= sample_rows:
                    break
    except UnicodeDecodeError:
        raise DataError(
            f"{path} is not UTF-8 text: it is not a CSV file fullthrottle can read. Re-save it "
            "as UTF-8 CSV."
        ) from None
    except csv.Error as exc:
        raise DataError(f"{path} is not a readable CSV file: {exc}") from None
    if len(header) < 2:
        raise DataError(
            f"{path} has a single column {header[0]!r}: fullthrottle needs comma-separated "
            "columns (a label and at least one feature). Is the delimiter something other than "
            "a comma? Convert the file to CSV first."
        )
    check_header_names(raw_header, source=str(path))
    if not rows:
        raise DataError(f"{path} has a header but no rows of data")
    return header, rows, places


def _read_parquet_sample(
    files: list[Path], sample_rows: int
) -> tuple[list[str], dict[str, list], dict[str, bool], list[str], dict[str, str]]:
    """Column names, the first `sample_rows` rows' values per column (None for missing),
    which columns are numbers, where each row is ("b.parquet row 3"), and the columns of an
    unsupported type with the reason (fullthrottle/core/parquet.py)."""
    import pyarrow.parquet as pq

    from fullthrottle.core import parquet

    schema = parquet.common_schema(files)
    header = list(schema.names)
    where = str(files[0]) if len(files) == 1 else f"{files[0].parent} ({len(files)} files)"
    parquet.check_not_empty(files, where=where)
    kinds = {name: parquet.kind_of(schema.field(name).type) for name in header}
    unsupported = {
        name: parquet.unsupported_reason(schema.field(name).type)
        for name, kind in kinds.items()
        if kind is None
    }
    readable = [name for name in header if name not in unsupported]
    columns: dict[str, list] = {name: [] for name in readable}
    places: list[str] = []
    for path in files:
        prefix = f"{path.name} " if len(files) > 1 else ""
        number = 0
        try:
            batches = pq.ParquetFile(path).iter_batches(batch_size=4096, columns=readable)
            for batch in batches:
                batch = batch.slice(0, sample_rows - len(places))
                for name in readable:
                    array = parquet.plain_column(batch.column(name), column=name, where=str(path))
                    columns[name] += array.to_pylist()
                places += [f"{prefix}row {number + n}" for n in range(1, batch.num_rows + 1)]
                number += batch.num_rows
                if len(places) >= sample_rows:
                    break
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged page: name the file
            raise parquet.damaged_file(path, exc) from None
        if len(places) >= sample_rows:
            break
    numeric = {name: kinds[name] in (parquet.INT, parquet.FLOAT) for name in readable}
    return header, columns, numeric, places, unsupported


def _is_tfrecord_file(path: Path) -> bool:
    return path.name.lower().endswith(_TFRECORD_SUFFIXES)


def _read_tfrecord_sample(
    files: list[Path], sample_rows: int
) -> tuple[list[str], list[dict[str, list]], dict[str, str], list[str]]:
    """Feature names, per-record values, each feature's value kind ("float"/"int"/"bytes") and
    where each record is ("part-0.gz record 3")."""
    import tensorflow as tf

    records: list[dict[str, list]] = []
    places: list[str] = []
    kinds: dict[str, str] = {}
    for path in files:
        with path.open("rb") as f:
            compression = "GZIP" if f.read(2) == b"\x1f\x8b" else ""
        try:
            dataset = tf.data.TFRecordDataset([str(path)], compression_type=compression)
            for number, raw in enumerate(dataset.take(sample_rows - len(records)), start=1):
                example = tf.train.Example.FromString(raw.numpy())
                values: dict[str, list] = {}
                for name, feature in example.features.feature.items():
                    kind = feature.WhichOneof("kind")
                    if kind is None:
                        continue
                    short = {"float_list": "float", "int64_list": "int", "bytes_list": "bytes"}[
                        kind
                    ]
                    if kinds.setdefault(name, short) != short and {kinds[name], short} != {
                        "float",
                        "int",
                    }:
                        raise DataError(
                            f"{path}: feature {name!r} holds {short} values in one record and "
                            f"{kinds[name]} in another; give it one type"
                        )
                    values[name] = list(getattr(feature, kind).value)
                records.append(values)
                places.append(f"{path.name} record {number}")
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - TF raises DataLossError and friends; all mean bad input
            raise DataError(
                f"{path} is not a readable TFRecord file of tf.Example records ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}). Point --data at a CSV file or a "
                "folder of TFRecord files."
            ) from None
        if len(records) >= sample_rows:
            break
    if not records:
        raise DataError(f"{files[0]} holds no records")
    names = sorted(kinds)
    return names, records, kinds, places


# --- the label's task -------------------------------------------------------------------------
# A label of numbers is a regression target when some are fractional, or when there are more than
# REGRESSION_MIN_DISTINCT distinct values that are either a sizeable share of the rows
# (REGRESSION_MIN_DISTINCT_SHARE) or spread thinly over a wide range of integers (the range at
# least REGRESSION_SPARSE_RANGE times the number of distinct values). Class ids are few and
# dense (0 .. K-1); measurements and prices are many or sparse. The rule depends on shares, so it
# holds the same at 400, 10,000 and 1,000,000 rows; more than REGRESSION_MANY_DISTINCT distinct
# numbers are a regression target in any case.
REGRESSION_MIN_DISTINCT = 50
REGRESSION_MIN_DISTINCT_SHARE = 0.05
REGRESSION_SPARSE_RANGE = 2
# More distinct numbers than this are a regression target whatever the row count.
REGRESSION_MANY_DISTINCT = 1000


def label_task(values: list[str]) -> tuple[str, str]:
    """("classification" | "regression", the reason in words) for the present label cells."""
    distinct = set(values)
    numbers = []
    for value in distinct:
        try:
            number = float(value)
        except ValueError:
            return "classification", "not every label is a number: each distinct value is a class"
        if not math.isfinite(number):
            return "classification", f"the label {value!r} is not a finite number"
        numbers.append(number)
    fractional = [n for n in numbers if not n.is_integer()]
    if fractional:
        return "regression", (
            f"numbers with fractions (e.g. {fractional[0]:g}): a quantity to predict, not classes"
        )
    if len(distinct) > REGRESSION_MANY_DISTINCT:
        return "regression", (
            f"{len(distinct)} distinct numbers in {len(values)} labelled rows: more than "
            f"{REGRESSION_MANY_DISTINCT} values are a quantity, not classes"
        )
    share = len(distinct) / len(values)
    spread = max(numbers) - min(numbers) + 1
    if len(distinct) > REGRESSION_MIN_DISTINCT and share >= REGRESSION_MIN_DISTINCT_SHARE:
        return "regression", (
            f"{len(distinct)} distinct numbers in {len(values)} labelled rows ({share:.0%}): "
            "too many to be classes"
        )
    if len(distinct) > REGRESSION_MIN_DISTINCT and spread >= REGRESSION_SPARSE_RANGE * len(
        distinct
    ):
        return "regression", (
            f"{len(distinct)} distinct whole numbers spread over {min(numbers):g} .. "
            f"{max(numbers):g}: a quantity, not class ids"
        )
    return "classification", f"{len(distinct)} distinct values: few enough to be classes"


def median_absolute_error(values: list[str]) -> float:
    """The mean absolute error of always answering the median of `values` (numbers)."""
    numbers = [float(v) for v in values]
    median = statistics.median(numbers)
    return sum(abs(n - median) for n in numbers) / len(numbers)


# --- deciding ------------------------------------------------------------------------------
def _parses_as_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _text_settings(name: str, values: list[str]) -> TextSettings:
    # CJK is written without spaces between words, so whitespace splitting would make each
    # message one token; characters work for both scripts (English just gets longer sequences).
    cjk = sum(1 for v in values if _CJK.search(v)) >= CJK_CHAR_TOKENIZER_FRACTION * len(values)
    tokenizer = "char" if cjk else "word"
    if tokenizer == "char":
        lengths = sorted(len([c for c in v if not c.isspace()]) for v in values)
        tokens = Counter(c for v in values for c in v.lower() if not c.isspace())
    else:
        lengths = sorted(len(v.split()) for v in values)
        tokens = Counter(t for v in values for t in v.lower().split())
    # 95th percentile of the length, rounded up to a multiple of 8: long outliers are truncated
    # rather than padding every example to the longest one.
    p95 = lengths[min(len(lengths) - 1, math.ceil(0.95 * len(lengths)) - 1)] if lengths else 8
    max_tokens = min(256, max(8, 8 * math.ceil(p95 / 8)))
    # Twice the tokens seen in the sample (the full data has more), at least 100, at most 20k.
    vocab_size = min(20_000, max(100, 2 * len(tokens)))
    return TextSettings(name, tokenizer, max_tokens, vocab_size)


def _describe_values(counter: Counter, limit: int = 4) -> str:
    shown = [repr(v)[:40] for v, _ in counter.most_common(limit)]
    more = f", ... ({len(counter)} in all)" if len(counter) > limit else ""
    return ", ".join(shown) + more


def _decide(
    name: str,
    present: list,
    *,
    numeric: bool,
    forced_text: bool,
) -> tuple[str, str]:
    """(kind, reason) for one feature column from its present values."""
    counter = Counter(present)
    if not present:
        return "dropped", "no value in the sample (every cell is missing)"
    if len(counter) == 1:
        only = next(iter(counter))
        return (
            "dropped",
            f"a single value ({str(only)[:40]!r}) in every present cell: nothing to learn from",
        )
    if forced_text:
        return "text", "named with --text"
    if numeric:
        numbers = [float(v) for v in present]
        finite = [v for v in numbers if math.isfinite(v)]
        span = f"{min(finite):g} .. {max(finite):g}" if finite else "no finite value"
        return "numeric", f"every present cell is a number ({span})"
    strings = [str(v) for v in present]
    # The typical value decides, not the mean: one 12,000-character cell in a column of island
    # names would pull the mean length far above any threshold.
    median_length = statistics.median(len(v) for v in strings)
    median_words = statistics.median(len(v.split()) for v in strings)
    distinct_fraction = len(counter) / len(strings)
    if median_length >= TEXT_MIN_MEDIAN_LENGTH:
        return "text", f"long strings (median {median_length:.0f} characters)"
    if median_words >= TEXT_MIN_MEDIAN_WORDS and distinct_fraction >= TEXT_MIN_DISTINCT_FRACTION:
        return "text", (
            f"sentence-like strings (median {median_words:.0f} words, {distinct_fraction:.0%} "
            "distinct)"
        )
    if len(counter) == len(strings) and len(strings) >= 20:
        return (
            "dropped",
            "every value is distinct: it looks like an identifier (add it back if it is not)",
        )
    return "categorical", f"{len(counter)} distinct values: {_describe_values(counter)}"


def _source_files(path: Path) -> tuple[str, list[Path]]:
    if not path.exists():
        raise DataError(
            missing_path_message(path, "data path", "; point --data at a CSV file or a folder")
        )
    from fullthrottle.core.parquet import MAGIC, is_parquet_name, parquet_files

    if path.is_file():
        with path.open("rb") as f:
            magic = f.read(4)
        if is_parquet_name(path) or magic == MAGIC:
            return "parquet", parquet_files(path, field="--data")
        if _is_tfrecord_file(path):
            raise DataError(
                f"{path} is a single TFRecord file: fullthrottle reads TFRecord data from a folder; "
                "put it in a folder of its own and point --data at that folder"
            )
        return "csv", [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    if any(is_parquet_name(p) for p in files):
        return "parquet", parquet_files(path, field="--data")
    if not files:
        raise DataError(f"data folder {path} has no files in it")
    if all(_is_tfrecord_file(p) for p in files):
        return "tfrecord", files
    if any(_is_tfrecord_file(p) for p in files):
        raise DataError(
            f"data folder {path} mixes TFRecord and other files; keep one kind per folder"
        )
    return "csv", files


def infer_columns(
    path: str | Path,
    *,
    label: str,
    text_columns: tuple[str, ...] = (),
    sample_rows: int = DEFAULT_SAMPLE_ROWS,
    task: str | None = None,
) -> Inference:
    """Reads a sample of `path` and decides every column; raises `DataError` on unusable input.

    `task` ("classification" or "regression") overrides what `label_task` decides."""
    path = Path(path)
    data_format, files = _source_files(path)
    unsupported: dict[str, str] = {}  # Parquet columns of a type fullthrottle does not read
    if data_format == "csv":
        header, rows, places = _read_csv_sample(files[0], sample_rows)
        seen_na = {cell for row in rows for cell in row if cell in NA_CANDIDATES}
        na_values = tuple(v for v in NA_CANDIDATES if v in seen_na)
        columns: dict[str, list] = {h: [] for h in header}
        for row in rows:
            for name, cell in zip(header, row, strict=True):
                columns[name].append(None if cell == "" or cell in seen_na else cell)
        numeric_kinds = {
            name: all(_parses_as_number(v) for v in values if v is not None)
            for name, values in columns.items()
        }
        rows_sampled = len(rows)
    elif data_format == "parquet":
        header, columns, numeric_kinds, places, unsupported = _read_parquet_sample(
            files, sample_rows
        )
        na_values = ()
        rows_sampled = len(places)
    else:
        header, records, kinds, places = _read_tfrecord_sample(files, sample_rows)
        na_values = ()
        columns = {h: [] for h in header}
        for record in records:
            for name in header:
                values = record.get(name) or []
                value = values[0] if values else None
                if isinstance(value, bytes):
                    value = value.decode("utf-8", errors="replace")
                columns[name].append(value)
        numeric_kinds = {name: kinds[name] in ("float", "int") for name in header}
        rows_sampled = len(records)
    where = files[0]

    if label in unsupported:
        raise DataError(
            f"{where}: the label column {label!r} is of an unsupported type ({unsupported[label]})."
        )
    unknown_text = [t for t in text_columns if t in unsupported]
    if unknown_text:
        raise DataError(
            f"{where}: column {unknown_text[0]!r} (named with --text) is of an unsupported type "
            f"({unsupported[unknown_text[0]]})."
        )
    if label not in columns:
        close = [h for h in header if h.lower() == label.lower()]
        hint = f" (did you mean {close[0]!r}? names are case-sensitive)" if close else ""
        raise DataError(
            f"{where} has no label column {label!r}{hint}; its columns are: {', '.join(header)}. "
            "Pass one of them with --label."
        )
    unknown_text = [t for t in text_columns if t not in columns]
    if unknown_text:
        raise DataError(
            f"{where} has no column {', '.join(map(repr, unknown_text))} (named with --text); its "
            f"columns are: {', '.join(header)}"
        )
    if label in text_columns:
        raise DataError(
            f"--text names the label column {label!r}; the label cannot also be a feature"
        )

    label_values = [str(v) for v in columns[label] if v is not None]
    label_counter = Counter(label_values)
    label_missing = rows_sampled - len(label_values)
    if len(label_counter) < 2:
        found = (
            f"only the value {next(iter(label_counter))!r}" if label_counter else "no value at all"
        )
        raise DataError(
            f"label column {label!r} of {where} has {found} in the {rows_sampled} rows sampled: "
            "nothing to learn (a classifier needs at least two classes, a regression model "
            "varying numbers). Pick another --label or add rows with other values."
        )
    detected, task_reason = label_task(label_values)
    if task is None:
        task = detected
    else:
        task_reason = f"--task {task}"
    findings: list[Finding] = []
    median_mae = None
    if task == "regression":
        numbers = inspect_numbers(label, _cells(places, columns[label]))
        finding = numbers.finding(
            where="`data.label`",
            categorical_hint="Or leave --task out to train a classifier on the label's values.",
        )
        if finding is not None:
            raise DataError(f"{where}: --task regression needs a label of numbers: {finding}")
        median_mae = median_absolute_error(label_values)
        unlabelled = [
            place for place, value in zip(places, columns[label], strict=True) if value is None
        ]
        if unlabelled:
            shown = ", ".join(unlabelled[:5]) + (" ..." if len(unlabelled) > 5 else "")
            findings.append(
                Finding(
                    label,
                    "`data.label`",
                    f"{len(unlabelled)} of {rows_sampled} sampled rows have no label value "
                    f"({shown}); a regression model learns only from rows with a number to predict",
                    "Remove those rows or fill in their labels.",
                )
            )
        floats = [float(v) for v in label_values]
        label_reason = (
            f"a number to predict: {min(floats):g} .. {max(floats):g}, "
            f"{len(label_counter)} distinct values"
        )
    else:
        if looks_continuous(len(label_counter), len(label_values)):
            raise DataError(
                f"label column {label!r} of {where} has {len(label_counter)} distinct values in "
                f"{len(label_values)} rows: it looks like an identifier or free text, not classes. "
                "Bucket it into classes first, or pick another --label."
            )
        labels = inspect_labels(label, _cells(places, columns[label])).finding(mode="stop")
        if labels is not None:
            findings.append(labels)
        label_reason = f"{len(label_counter)} classes: {_describe_values(label_counter)}"
    reports = [
        ColumnReport(
            label,
            "label",
            label_reason + (f"; {label_missing} rows have no label" if label_missing else ""),
            len(label_values),
            label_missing,
            len(label_counter),
        )
    ]
    numeric: list[str] = []
    categorical: list[str] = []
    text: list[TextSettings] = []
    dropped: list[ColumnReport] = []
    for name in header:
        if name == label:
            continue
        if name in unsupported:
            report = ColumnReport(name, "dropped", unsupported[name], 0, 0, 0)
            reports.append(report)
            dropped.append(report)
            continue
        present = [v for v in columns[name] if v is not None]
        kind, reason = _decide(
            name,
            present,
            numeric=numeric_kinds[name],
            forced_text=name in text_columns,
        )
        if (
            kind in ("categorical", "dropped")
            and len(set(present)) > 1
            and name not in text_columns
            and data_format != "parquet"  # a Parquet column's type is the file's, not a guess
        ):
            # Numbers except a few cells (or in another notation): not a guess, a question.
            numbers = inspect_numbers(name, _cells(places, columns[name]))
            if numbers.looks_numeric:
                kind = "numeric"
                reason = (
                    f"numbers, except {numbers.unparsed} of {numbers.present} present cells: "
                    "needs a decision before training (see the note above)"
                )
                findings.append(numbers.finding(where="`data.numeric`", categorical_hint=MOVE_HINT))
        if kind in ("categorical", "text", "dropped") and not numeric_kinds[name]:
            outliers = long_outliers(_cells(places, columns[name]))
            if outliers:
                reason = f"{reason}; {outliers}"
        report = ColumnReport(
            name, kind, reason, len(present), rows_sampled - len(present), len(set(present))
        )
        reports.append(report)
        if kind == "numeric":
            numeric.append(name)
        elif kind == "categorical":
            categorical.append(name)
        elif kind == "text":
            text.append(_text_settings(name, [str(v) for v in present]))
        else:
            dropped.append(report)
    if not (numeric or categorical or text):
        notes = "; ".join(f"{r.name}: {r.reason}" for r in dropped) or "there is no other column"
        raise DataError(
            f"{where}: no usable feature column besides the label {label!r} ({notes}). A model "
            "needs at least one column that varies."
        )
    return Inference(
        path=path,
        format=data_format,
        source_file=files[0],
        rows_sampled=rows_sampled,
        label=label,
        label_classes=tuple(label_counter.most_common()),
        numeric=tuple(numeric),
        categorical=tuple(categorical),
        text=tuple(text),
        dropped=tuple(dropped),
        na_values=na_values,
        columns=tuple(reports),
        findings=tuple(findings),
        task=task,
        task_reason=task_reason,
        median_mae=median_mae,
    )


def long_outliers(cells: Iterator[tuple[str, str]]) -> str | None:
    """Words for the cells far longer than the column's typical (median) one, with their places
    ("2 cells far longer than the typical 6 characters: 12000 at line 57, ..."), or None."""
    present = [(place, cell) for place, cell in cells if cell]
    if not present:
        return None
    typical = statistics.median(len(cell) for _, cell in present)
    limit = max(OUTLIER_MIN_LENGTH, OUTLIER_LENGTH_FACTOR * typical)
    outliers = [(place, len(cell)) for place, cell in present if len(cell) > limit]
    if not outliers:
        return None
    shown = ", ".join(f"{length:,} at {place}" for place, length in outliers[:OUTLIERS_SHOWN])
    more = f", ... ({len(outliers)} in all)" if len(outliers) > OUTLIERS_SHOWN else ""
    cells_word = "a cell" if len(outliers) == 1 else f"{len(outliers)} cells"
    return (
        f"{cells_word} far longer than the typical {typical:.0f} characters ({shown}{more}); "
        "the kind follows the typical value. Check the line: an unbalanced quote merges rows "
        "into one cell"
    )


def _cells(places: list[str], values: list) -> Iterator[tuple[str, str]]:
    """(place, cell) pairs of a sampled column; missing cells are empty."""
    return ((place, "" if v is None else str(v)) for place, v in zip(places, values, strict=True))
