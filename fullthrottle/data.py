"""Finding, checking and staging the input data before any pipeline work starts.

`prepare_data` resolves bundled names, checks that the files exist, are not empty and have
every configured column, and writes a normalized copy of CSV input into the run's output folder
(cells equal to one of `na_values` become empty, which TFX's CSV decoder reads as missing).
The copy is rewritten only when its content changes, so an unchanged input keeps its file
fingerprint and the pipeline's cache stays valid.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

from fullthrottle.config import BUNDLED_PENGUINS, BUNDLED_TEXT, Config, DataSpec
from fullthrottle.errors import DataError

STAGED_CSV = "data.csv"


@dataclass(frozen=True)
class PreparedData:
    """Where the pipeline reads from, and what was found there."""

    input_base: str  # folder handed to ExampleGen
    source_files: tuple[str, ...]
    columns: tuple[str, ...]
    rows: int | None  # counted for CSV input


def bundled_path(name: str) -> Path:
    if name == BUNDLED_PENGUINS:
        import palmerpenguins

        return Path(palmerpenguins.__file__).parent / "data" / "penguins.csv"
    if name == BUNDLED_TEXT:
        from fullthrottle import datasets

        return datasets.text_topics_path()
    raise DataError(f"unknown bundled dataset {name!r}; bundled ones are {BUNDLED_PENGUINS!r} and {BUNDLED_TEXT!r}")


def source_files(spec: DataSpec) -> list[Path]:
    if spec.path in (BUNDLED_PENGUINS, BUNDLED_TEXT):
        return [bundled_path(spec.path)]
    path = Path(spec.path)
    if not path.exists():
        raise DataError(
            f"data path {path} does not exist (config field `data.path`); point it at a "
            f"{'CSV file or a folder of CSV files' if spec.format == 'csv' else 'folder of TFRecord files'}"
        )
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise DataError(f"data folder {path} (config field `data.path`) has no files in it")
        return files
    return [path]


def _read_csv_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    raw = path.read_bytes()
    if not raw.strip():
        raise DataError(f"{path} is empty: a CSV needs a header line and at least one row of data")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(
            f"{path} is not UTF-8 text (bad byte at line {line}); re-save it as UTF-8"
        ) from None
    if "\x00" in text:
        raise DataError(f"{path} contains NUL bytes: it does not look like a CSV file")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(f"{path} is empty: a CSV needs a header line and at least one row of data") from None
    header = [h.strip() for h in header]
    rows = [row for row in reader if row and any(cell.strip() for cell in row)]
    return header, rows


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
            kind = "numeric" if name in spec.numeric else "categorical" if name in spec.categorical else "text"
            fields.append(f"{name!r} (in `data.{kind}`)")
        raise DataError(
            f"{where} has no column {', '.join(fields)}; its columns are: {', '.join(header)}. "
            "Fix the config or the file."
        )


def _prepare_csv(spec: DataSpec, files: list[Path], staged_dir: Path) -> PreparedData:
    header0: list[str] | None = None
    all_rows: list[list[str]] = []
    na = set(spec.na_values)
    for path in files:
        header, rows = _read_csv_rows(path)
        if len(header) < 2 and len(rows) > 0:
            raise DataError(
                f"{path} has a single column {header[0]!r}: is the delimiter something other than a comma? "
                "fullthrottle reads comma-separated files; convert it first."
            )
        _check_columns(spec, header, str(path))
        if header0 is None:
            header0 = header
        elif header != header0:
            raise DataError(f"{path} has a different header from {files[0]}; all CSV files must share one header")
        for line_no, row in enumerate(rows, start=2):
            if len(row) != len(header):
                raise DataError(
                    f"{path}, line {line_no}: {len(row)} fields where the header has {len(header)}; fix the row"
                )
            if row == header:
                raise DataError(f"{path}, line {line_no}: the header line appears again inside the data; remove it")
            all_rows.append(["" if cell in na else cell for cell in row])
    assert header0 is not None
    if not all_rows:
        raise DataError(f"{files[0]} has a header but no rows of data")
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header0)
    writer.writerows(all_rows)
    content = buffer.getvalue().encode("utf-8")
    staged_dir.mkdir(parents=True, exist_ok=True)
    target = staged_dir / STAGED_CSV
    if not target.exists() or hashlib.sha256(target.read_bytes()).digest() != hashlib.sha256(content).digest():
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(content)
        os.replace(tmp, target)
    for stale in staged_dir.iterdir():
        if stale.name != STAGED_CSV:
            stale.unlink()
    return PreparedData(str(staged_dir), tuple(map(str, files)), tuple(header0), len(all_rows))


def _prepare_tfrecord(spec: DataSpec, files: list[Path]) -> PreparedData:
    import tensorflow as tf

    first = files[0]
    data = first.read_bytes()
    if not data:
        raise DataError(f"{first} is empty: a TFRecord file needs at least one record")
    compression = "GZIP" if data[:2] == b"\x1f\x8b" else None
    if compression:
        try:
            gzip.decompress(data[: 1 << 20]) if len(data) <= 1 << 20 else None
        except (OSError, EOFError):
            raise DataError(f"{first} looks gzip-compressed but is corrupted; re-export it") from None
    try:
        record = next(iter(tf.data.TFRecordDataset([str(first)], compression_type=compression or "")))
        example = tf.train.Example.FromString(record.numpy())
    except Exception as exc:  # noqa: BLE001 - TF raises DataLossError and friends; all mean bad input
        raise DataError(f"{first} is not a readable TFRecord file of tf.Example records: {exc}") from None
    header = list(example.features.feature.keys())
    _check_columns(spec, header, str(first))
    parent = first.parent if Path(spec.path).is_dir() else None
    if parent is None:
        raise DataError(f"`data.path` must be a folder of TFRecord files for format 'tfrecord', got the file {first}")
    return PreparedData(str(parent), tuple(map(str, files)), tuple(header), None)


def prepare_data(config: Config) -> PreparedData:
    """Checks the configured data and stages it for ExampleGen; raises `DataError` when unusable."""
    spec = config.data
    files = source_files(spec)
    if spec.format == "tfrecord":
        return _prepare_tfrecord(spec, files)
    return _prepare_csv(spec, files, config.staged_data_dir)
