"""Parquet input: which files, which column types, and the checks before any component runs.

A Parquet column's type comes from the file's schema, not from its values:

- integers of any width (int8 .. uint64) -> INT (tf.Example int64_list); booleans -> INT 0/1;
- float16/32/64 -> FLOAT (float_list);
- string, large_string, string_view, and dictionary-encoded strings (pandas' `category`) -> STRING
  (bytes_list, UTF-8).

Every other type (list, struct, map, binary, date, time, timestamp, duration, decimal, null...)
is refused for the columns the config uses, naming the column and its Arrow type; `init` leaves
such a column out and says why. A null is a missing value, as are NaN in a float column and ""
in a string column (what an empty CSV cell is); `data.na_values` applies to CSV only.

The files of a folder must share one schema (the same column names and types); the first
difference is refused naming both files and the column. A file that is not Parquet (its first
and last four bytes are not `PAR1`) or holds no rows is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from fullthrottle.core.errors import DataError

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
MAGIC = b"PAR1"
INT, FLOAT, STRING = "INT", "FLOAT", "STRING"
# Files Spark and Hadoop write beside the data (_SUCCESS, _metadata, .crc): not data files.
_MARKER_PREFIXES = ("_", ".")


def is_parquet_name(path: Path | str) -> bool:
    return str(path).lower().endswith(PARQUET_SUFFIXES)


def parquet_files(path: Path, *, field: str = "config field `data.path`") -> list[Path]:
    """The Parquet files of `path` (a file, or a folder of `.parquet` files), checked to be
    Parquet. A folder's other files are refused, except Spark's markers (`_SUCCESS`, `.crc`)."""
    if path.is_dir():
        names = sorted(p for p in path.iterdir() if not p.name.startswith(_MARKER_PREFIXES))
        files = [p for p in names if p.is_file() and is_parquet_name(p)]
        others = [p.name for p in names if p not in files]
        if others:
            raise DataError(
                f"data folder {path} ({field}) holds files that are not Parquet files "
                f"({', '.join(others[:5])}{' ...' if len(others) > 5 else ''}); with "
                "`data.format: parquet` every data file must end in .parquet. Move the others "
                "out, or point the path at a folder of Parquet files only."
            )
        if not files:
            raise DataError(
                f"data folder {path} ({field}) has no .parquet files: it is empty as Parquet "
                "input. Put the Parquet files there, or point the path at the right folder."
            )
    else:
        files = [path]
    for file in files:
        check_magic(file)
    return files


def check_magic(path: Path) -> None:
    """A Parquet file starts and ends with `PAR1`; anything else (a CSV renamed .parquet, a
    truncated copy) is refused here rather than deep in a reader."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(4)
        if size >= 8:
            f.seek(size - 4)
        tail = f.read(4) if size >= 8 else b""
    if head != MAGIC or tail != MAGIC:
        what = (
            "is empty (0 bytes)"
            if size == 0
            else "is a truncated Parquet file (it does not end with the Parquet footer)"
            if head == MAGIC
            else "is not a Parquet file (it does not start with the Parquet magic bytes PAR1"
            + ("; it looks like text, a CSV?)" if _looks_like_text(path) else ")")
        )
        raise DataError(
            f"{path} {what}. With `data.format: parquet` the data must be Parquet files (written "
            "by pandas' to_parquet, pyarrow, Spark...); re-export it, or set `data.format: csv` "
            "for a CSV file."
        )


def _looks_like_text(path: Path) -> bool:
    with path.open("rb") as f:
        head = f.read(4096)
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in head


def kind_of(arrow_type: Any) -> str | None:
    """INT, FLOAT or STRING for a supported Arrow type, None for any other."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        return kind_of(arrow_type.value_type)
    if pa.types.is_boolean(arrow_type) or pa.types.is_integer(arrow_type):
        return INT
    if pa.types.is_floating(arrow_type):
        return FLOAT
    if (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_string_view(arrow_type)
    ):
        return STRING
    return None


def unsupported_reason(arrow_type: Any) -> str:
    """Why a column of `arrow_type` is not taken, and what to do with it."""
    import pyarrow as pa

    nested = (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
        or pa.types.is_struct(arrow_type)
        or pa.types.is_map(arrow_type)
    )
    if nested:
        fix = "flatten it into columns of single numbers or strings"
    elif pa.types.is_temporal(arrow_type):
        fix = "convert it to a number (e.g. seconds since 1970, or day of week) or a string"
    elif pa.types.is_decimal(arrow_type):
        fix = "cast it to float64"
    elif pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        fix = "decode it to a string column"
    elif pa.types.is_null(arrow_type):
        fix = "it holds no value at all; drop it"
    else:
        fix = "cast it to an integer, float or string column"
    return (
        f"Arrow type {arrow_type}: fullthrottle reads integer, float, boolean and string "
        f"columns only; {fix}"
    )


def read_schema(path: Path) -> Any:
    """The Arrow schema of one Parquet file (its footer); DataError for a damaged file."""
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path)
    except Exception as exc:  # noqa: BLE001 - ArrowInvalid, OSError...: a damaged file either way
        raise DataError(
            f"{path} is not a readable Parquet file ({_first_line(exc)}); re-export it"
        ) from None


def common_schema(files: Sequence[Path]) -> Any:
    """The schema every file shares; DataError naming both files and the first column that
    differs (missing, extra or of another type)."""
    first = read_schema(files[0])
    for path in files[1:]:
        other = read_schema(path)
        if other.equals(first, check_metadata=False):
            continue
        names, other_names = first.names, other.names
        for name in names:
            if name not in other_names:
                problem = f"has no column {name!r}, which {files[0]} has"
                break
            if first.field(name).type != other.field(name).type:
                problem = (
                    f"has column {name!r} of type {other.field(name).type} where {files[0]} has "
                    f"{first.field(name).type}"
                )
                break
        else:
            extra = next((n for n in other_names if n not in names), None)
            problem = (
                f"has a column {extra!r} that {files[0]} lacks"
                if extra is not None
                else f"has the columns in another order ({', '.join(other_names)})"
            )
        raise DataError(
            f"the Parquet files of one folder differ in schema: {path} {problem}. Every file of "
            "the folder must have the same columns with the same types; re-export them with one "
            "schema (e.g. cast the column), or move the odd file out."
        )
    return first


def row_count(files: Iterable[Path]) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(path).metadata.num_rows for path in files)


def check_not_empty(files: Sequence[Path], *, where: str) -> int:
    rows = row_count(files)
    if not rows:
        raise DataError(
            f"{where} holds no rows: Parquet input needs at least one row of data. Check the "
            "export (a filter that matched nothing?) or point `data.path` at other files."
        )
    return rows


def plain_column(array: Any, *, column: str = "", where: str = "") -> Any:
    """A column as int64, float64 or string, with every missing value a null: NaN in a float
    column and "" in a string column are missing, as an empty CSV cell is."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    kind = kind_of(array.type)
    if kind == INT:
        try:
            return array.cast(pa.int64())
        except pa.ArrowInvalid:
            raise DataError(
                f"{where}: column {column!r} ({array.type}) holds a value above 2^63 - 1, which "
                "tf.Example's int64 cannot hold; cast the column to float64 or string"
            ) from None
    if kind == FLOAT:
        array = array.cast(pa.float64())
        return pc.if_else(pc.is_nan(array), pa.scalar(None, pa.float64()), array)
    array = array.cast(pa.string())
    return pc.if_else(pc.equal(array, ""), pa.scalar(None, pa.string()), array)


def read_table(files: Sequence[Path], columns: Sequence[str]) -> Any:
    """`columns` of all `files`, one table, each column made plain (`plain_column`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for path in files:
        try:
            tables.append(pq.read_table(path, columns=list(columns)))
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged page: name the file
            raise damaged_file(path, exc) from None
    table = pa.concat_tables(tables)
    where = str(files[0]) if len(files) == 1 else f"{files[0].parent} ({len(files)} files)"
    return pa.table(
        {name: plain_column(table.column(name), column=name, where=where) for name in columns}
    )


def iter_batches(
    files: Sequence[Path], columns: Sequence[str], batch_rows: int
) -> Iterator[tuple[Path, int, Any]]:
    """`columns` of all `files`, `batch_rows` rows at a time, each column made plain
    (`plain_column`): (file, the number of the batch's first row in its file, record batch)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = str(files[0]) if len(files) == 1 else f"{files[0].parent} ({len(files)} files)"
    for path in files:
        number = 1
        try:
            batches = pq.ParquetFile(path).iter_batches(
                batch_size=batch_rows, columns=list(columns)
            )
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                plain = pa.record_batch(
                    [
                        plain_column(batch.column(name), column=name, where=where)
                        for name in columns
                    ],
                    names=list(columns),
                )
                yield path, number, plain
                number += batch.num_rows
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged page: name the file
            raise damaged_file(path, exc) from None


class StagedWriters:
    """One staged Parquet file per split (`targets`: split -> path), written batch by batch as
    single-value lists (`as_single_value_lists`) in row groups of `group_rows` rows: the same
    batches give the same bytes (no timestamps in pyarrow's footer)."""

    def __init__(self, targets: Mapping[str, Path], group_rows: int) -> None:
        self.targets = dict(targets)
        self.group_rows = group_rows
        self.writers: dict[str, Any] = {}
        self.pending: dict[str, list[Any]] = {name: [] for name in targets}
        self.schema: Any = None

    def write(self, split: str, batch: Any) -> None:
        import pyarrow as pa

        listed = pa.record_batch(
            [as_single_value_lists(column) for column in batch.columns], names=batch.schema.names
        )
        if self.schema is None:
            self.schema = listed.schema
        self.pending[split].append(listed)
        if sum(b.num_rows for b in self.pending[split]) >= self.group_rows:
            table = pa.Table.from_batches(self.pending[split], schema=self.schema)
            whole = table.num_rows - table.num_rows % self.group_rows
            self._writer(split).write_table(table.slice(0, whole), row_group_size=self.group_rows)
            self.pending[split] = table.slice(whole).to_batches()

    def _writer(self, split: str) -> Any:
        import pyarrow.parquet as pq

        if split not in self.writers:
            self.writers[split] = pq.ParquetWriter(
                self.targets[split], self.schema, compression="snappy"
            )
        return self.writers[split]

    def close(self) -> None:
        import pyarrow as pa

        for split in self.targets:
            table = pa.Table.from_batches(self.pending[split], schema=self.schema)
            writer = self._writer(split)
            if table.num_rows:
                writer.write_table(table, row_group_size=self.group_rows)
            writer.close()


def as_single_value_lists(array: Any) -> Any:
    """Each present value as a one-element list, each missing one as a null list.

    The staged files hold these, the Arrow form of tf.Example features that the pipeline's
    ArrowExampleGen and TFDV read: a `[0]` is the value 0, a null list a feature without values
    (missing, as an empty CSV cell). (TFX's stock Parquet executor, `dict_to_example`, would
    turn a bare falsy scalar such as 0 into a missing value.)"""
    import numpy as np
    import pyarrow as pa

    valid = np.asarray(array.is_valid())
    offsets = np.concatenate([[0], np.cumsum(valid, dtype=np.int32)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), array.drop_null(), mask=pa.array(~valid))


def cell_text(value: Any) -> str:
    """A value as a CSV cell would hold it ("" for missing)."""
    if value is None:
        return ""
    if isinstance(value, list):  # a staged single-value list
        return cell_text(value[0]) if value else ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def damaged_file(path: Path | str, exc: BaseException) -> DataError:
    """The error for a Parquet file a reader failed on (a damaged page): the file named."""
    return DataError(f"{path} is a damaged Parquet file ({_first_line(exc)}); re-export it")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
