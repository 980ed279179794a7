"""ExampleGen on Arrow record batches: CSV and Parquet files read in large batches with pyarrow,
each batch encoded into serialized tf.Examples at once by tfx-bsl's C++ encoder.

TFX's stock `CsvExampleGen` makes one Beam element per CSV line, infers the column types in a
pass over every line and builds each tf.Example in Python (~5-8k rows/s on 2 cores). This
executor writes the same examples: for each split, a first pass over its files finds each
column's type as the stock component infers it over the whole split (INT when every non-empty
cell is an int64, else FLOAT when every one is a float, else STRING; a column with no value at
all has no type), then a second pass converts every batch to those types and encodes it. A
missing cell is what the stock component writes for it: an empty value list of the column's
type (an empty feature for a column without a type).

Only the order of the features inside a serialized example can differ from the stock
component's: protobuf writes a map's entries in hash order, which the stock component's Python
protobuf draws anew in every process, so its own bytes differ between two runs too. Parsed,
the examples are the same (tests/test_arrow_example_gen.py compares them with the stock
component's on Beam). Like the stock component's, the examples are written in a random order
(random output shards, each permuted; seeded by the file's path, so the same input gives the
same examples in the same order).

Parquet files (`*.parquet`) are read with their own column types: integers and booleans as INT,
floating point as FLOAT, strings and binary as STRING, nulls as missing values, a list of such
values (one level: staging writes each cell as a one-value list) as a feature of its values;
any other type is refused with the column named. Memory is bounded: files are streamed in
record batches, never read whole, and a worker holds one output shard's examples at a time.

Used through TFX's `FileBasedExampleGen(custom_executor_spec=...)` (`example_gen`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tfx.components.example_gen.base_example_gen_executor import BaseExampleGenExecutor
from tfx.dsl.components.base import executor_spec
from tfx.dsl.io import fileio
from tfx.types import standard_component_specs

# Rows per record batch (CSV: bytes per block, below): large enough that the per-batch cost
# vanishes, small enough that a batch of wide rows stays a few tens of MB.
BATCH_ROWS = 65_536
CSV_BLOCK_BYTES = 8 << 20
PARQUET_SUFFIX = ".parquet"
# Input bytes per output shard: a shard's examples are held in memory while it is permuted
# (each shard reads its input file once more: a file of n * 64 MB is read n + 1 times).
SHARD_INPUT_BYTES = 64 << 20
# The node's id in the pipeline (its output folder, its Kubeflow step).
EXAMPLE_GEN_ID = "ArrowExampleGen"

# Column kinds, ordered as the stock inference widens them (tfx_bsl.coders.csv_decoder).
UNKNOWN, INT, FLOAT, STRING = 0, 1, 2, 3
KIND_NAMES = {UNKNOWN: "UNKNOWN", INT: "INT", FLOAT: "FLOAT", STRING: "STRING"}
_INT64_MIN, _INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max
_INTEGER_LOOKING = r"^[+-]?[0-9]+$"


class InputError(ValueError):
    """Input files this executor cannot read: the message names the file (and column)."""


def _value_kind(value: str) -> int:
    """One cell's kind exactly as TFX infers it (tfx_bsl.coders.csv_decoder._InferValueType)."""
    if not value:
        return UNKNOWN
    try:
        return INT if _INT64_MIN <= int(value) <= _INT64_MAX else STRING
    except ValueError:
        try:
            float(value)
        except ValueError:
            return STRING
        return FLOAT


def _cells_kind(values: pa.Array, kind: int) -> int:
    """The widest kind of `kind` and the non-empty string cells `values`: vectorized casts where
    Arrow's parsers accept the cells (a subset of what Python's int() and float() accept, with
    the same values), Python's own rules cell by cell where they do not."""
    if kind == STRING or len(values) == 0:
        return kind
    if kind <= INT:
        try:
            pc.cast(values, pa.int64())
            return INT
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    try:
        pc.cast(values, pa.float64())
        # Integer-looking cells beyond int64 make the stock inference give STRING.
        whole = values.filter(pc.match_substring_regex(values, _INTEGER_LOOKING))
        pc.cast(whole, pa.int64())
        return max(kind, FLOAT)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    for value in values.to_pylist():
        kind = max(kind, _value_kind(value))
        if kind == STRING:
            break
    return kind


class _GFileReader(io.RawIOBase):
    """A TFX filesystem file (gs://, s3://, ...) as the file object pyarrow reads."""

    def __init__(self, gfile: Any) -> None:
        self._file = gfile

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._file.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:
            offset += self._file.size()
        elif whence == io.SEEK_CUR:
            offset += self._file.tell()
        self._file.seek(offset)
        return self._file.tell()

    def tell(self) -> int:
        return self._file.tell()


@contextlib.contextmanager
def _open_binary(path: str) -> Iterator[Any]:
    """A binary file object pyarrow streams from: a plain file for local paths, TFX's
    filesystem layer for object stores."""
    if "://" not in path:
        with open(path, "rb") as f:
            yield f
        return
    with fileio.open(path, "rb") as f:
        yield io.BufferedReader(_GFileReader(f), buffer_size=CSV_BLOCK_BYTES)


def _csv_header(path: str) -> list[str]:
    """The header as the stock component reads it: the first line split at commas."""
    with fileio.open(path, "r") as f:
        return f.readline().strip().split(",")


def _csv_batches(path: str, names: list[str]) -> Iterator[pa.RecordBatch]:
    """Every cell of the file after its header as a string ("" for an empty cell), streamed."""
    import pyarrow.csv as pcsv

    with _open_binary(path) as f:
        reader = pcsv.open_csv(
            f,
            read_options=pcsv.ReadOptions(
                column_names=names, skip_rows=1, block_size=CSV_BLOCK_BYTES, use_threads=True
            ),
            parse_options=pcsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=True),
            convert_options=pcsv.ConvertOptions(
                column_types={name: pa.string() for name in names},
                null_values=[],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
        try:
            yield from reader
        except pa.ArrowInvalid as exc:
            raise InputError(f"{path}: cannot read it as CSV ({exc})") from None


def infer_csv_kinds(paths: Sequence[str], names: list[str]) -> list[int]:
    """Each column's kind over every cell of `paths`, as the stock CsvExampleGen infers it."""
    kinds = [UNKNOWN] * len(names)
    for path in paths:
        for batch in _csv_batches(path, names):
            for index, column in enumerate(batch.columns):
                if kinds[index] == STRING:
                    continue
                present = column.filter(pc.not_equal(column, ""))
                kinds[index] = _cells_kind(present, kinds[index])
    return kinds


def _offsets(present: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(present) + 1, dtype=np.int64)
    np.cumsum(present, out=offsets[1:])
    return pa.array(offsets)


def _csv_feature(column: pa.Array, kind: int) -> pa.Array:
    """One CSV column as the list array the encoder writes: one value per present cell, an
    empty list per missing one (a null, i.e. an empty feature, for a column without a type)."""
    if kind == UNKNOWN:
        return pa.nulls(len(column), pa.large_list(pa.int64()))
    mask = pc.not_equal(column, "")
    present = mask.to_numpy(zero_copy_only=False)
    values = column.filter(mask)
    if kind == STRING:
        flat = values.cast(pa.large_binary())
    elif kind == INT:
        try:
            flat = pc.cast(values, pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            flat = pa.array([int(v) for v in values.to_pylist()], pa.int64())
    else:
        try:
            doubles = pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            doubles = np.array([float(v) for v in values.to_pylist()], dtype=np.float64)
        # As the stock component: Python's float (a double), stored as a float32.
        with np.errstate(over="ignore"):
            flat = pa.array(doubles.astype(np.float32))
    return pa.LargeListArray.from_arrays(_offsets(present), flat)


def _parquet_kind(field: pa.Field, path: str) -> int:
    kind = field.type
    listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    if listed and not pa.types.is_nested(kind.value_type):
        # A list of values per row (staging writes each cell as a one-value list): a feature
        # of as many values, of the list's value type.
        return _parquet_kind(pa.field(field.name, kind.value_type), path)
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return INT
    if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return FLOAT
    if any(
        check(kind)
        for check in (
            pa.types.is_string,
            pa.types.is_large_string,
            pa.types.is_binary,
            pa.types.is_large_binary,
        )
    ):
        return STRING
    if pa.types.is_null(kind):
        return UNKNOWN
    raise InputError(
        f"{path}: column {field.name!r} has the Parquet type {kind}, which a tf.Example cannot "
        "hold (one value per row of integer, floating point, boolean or string type); convert "
        "or drop the column"
    )


def _parquet_feature(column: pa.Array, kind: int) -> pa.Array:
    """One Parquet column as a list array: a null is a missing value (an empty list)."""
    if kind == UNKNOWN:
        return pa.nulls(len(column), pa.large_list(pa.int64()))
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        # A null list is missing, as a null value is; values inside a list are taken as they are.
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        values = _flat_values(column.flatten(), kind)
        return pa.LargeListArray.from_arrays(offsets, values)
    present = pc.is_valid(column).to_numpy(zero_copy_only=False)
    return pa.LargeListArray.from_arrays(_offsets(present), _flat_values(column.drop_null(), kind))


def _flat_values(values: pa.Array, kind: int) -> pa.Array:
    """Present values as the encoder's types: bytes, int64 or float32."""
    if kind == STRING:
        return values.cast(pa.large_binary())
    if kind == INT:
        return values.cast(pa.int64())
    doubles = values.cast(pa.float64()).to_numpy(zero_copy_only=False)
    with np.errstate(over="ignore"):
        return pa.array(doubles.astype(np.float32))


def _encoder() -> Any:
    from tfx_bsl.coders import example_coder

    return example_coder.RecordBatchToExamplesEncoder()


def csv_feature_batches(path: str, names: list[str], kinds: list[int]) -> Iterator[pa.RecordBatch]:
    """One CSV file as record batches of the list columns the encoder takes."""
    for batch in _csv_batches(path, names):
        arrays = [
            _csv_feature(column, kind) for column, kind in zip(batch.columns, kinds, strict=True)
        ]
        yield pa.RecordBatch.from_arrays(arrays, names=names)


def parquet_feature_batches(path: str) -> Iterator[pa.RecordBatch]:
    """One Parquet file as record batches of the list columns the encoder takes."""
    import pyarrow.parquet as pq

    with _open_binary(path) as f:
        parquet = pq.ParquetFile(f)
        fields = list(parquet.schema_arrow)
        kinds = [_parquet_kind(field, path) for field in fields]
        names = [field.name for field in fields]
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
            arrays = [
                _parquet_feature(column, kind)
                for column, kind in zip(batch.columns, kinds, strict=True)
            ]
            yield pa.RecordBatch.from_arrays(arrays, names=names)


def encode_csv_file(path: str, names: list[str], kinds: list[int]) -> Iterator[list[bytes]]:
    """The serialized tf.Examples of one CSV file, a list per record batch."""
    encoder = _encoder()
    for batch in csv_feature_batches(path, names, kinds):
        yield encoder.encode(batch)


def encode_parquet_file(path: str) -> Iterator[list[bytes]]:
    """The serialized tf.Examples of one Parquet file, a list per record batch."""
    encoder = _encoder()
    for batch in parquet_feature_batches(path):
        yield encoder.encode(batch)


def _split_files(pattern: str) -> tuple[list[str], bool]:
    """The split's files (sorted) and whether they are Parquet; one format per split."""
    files = sorted(fileio.glob(pattern))
    if not files:
        raise RuntimeError(f"Split pattern {pattern} does not match any files.")
    parquet = [path.endswith(PARQUET_SUFFIX) for path in files]
    if any(parquet) and not all(parquet):
        raise InputError(
            f"the files matching {pattern} mix Parquet (*{PARQUET_SUFFIX}) and other files; "
            "a split holds files of one format"
        )
    return files, all(parquet)


FeatureBatches = Callable[[str], Iterator[pa.RecordBatch]]


def _split_reader(exec_properties: dict[str, Any], split_pattern: str) -> tuple[list[str], Any]:
    """The split's files and the function reading one of them as feature batches (for CSV,
    with the column types inferred over every file of the split, as the stock component)."""
    input_base = exec_properties[standard_component_specs.INPUT_BASE_KEY]
    files, parquet = _split_files(os.path.join(input_base, split_pattern))
    if parquet:
        return files, parquet_feature_batches
    names = _csv_header(files[0])
    for path in files[1:]:
        if _csv_header(path) != names:
            raise RuntimeError(f"Files in same split {split_pattern} have different header.")
    return files, functools.partial(
        csv_feature_batches, names=names, kinds=infer_csv_kinds(files, names)
    )


@beam.ptransform_fn
@beam.typehints.with_input_types(beam.Pipeline)
@beam.typehints.with_output_types(bytes)
def _ArrowToExample(  # noqa: N802 - TFX's naming for these transforms
    pipeline: beam.Pipeline, exec_properties: dict[str, Any], split_pattern: str
) -> beam.pvalue.PCollection:
    """One split's examples, one Beam element each: TFX's interface, for the output formats
    the executor's own `Do` does not write."""
    files, read = _split_reader(exec_properties, split_pattern)

    def examples(path: str) -> Iterator[bytes]:
        encoder = _encoder()
        for batch in read(path):
            yield from encoder.encode(batch)

    return pipeline | "CreateFiles" >> beam.Create(files) | "Read" >> beam.FlatMap(examples)


def _seed(path: str) -> int:
    return zlib.crc32(path.encode("utf-8"))


def shard_examples(path: str, read: FeatureBatches, *, shard: int, shards: int) -> list[bytes]:
    """Output shard `shard` of `shards` of one input file, in a random order: each row goes to
    a random shard (drawn per batch from a seed of the path, so every shard's pass over the file
    draws the same), each shard is permuted whole. Together the shards hold every row once; one
    shard's examples are in memory at a time."""
    encoder = _encoder()
    records: list[bytes] = []
    for index, batch in enumerate(read(path)):
        if shards > 1:
            keys = np.random.default_rng([_seed(path), index]).integers(0, shards, batch.num_rows)
            batch = batch.filter(pa.array(keys == shard))
        records.extend(encoder.encode(batch))
    order = np.random.default_rng([_seed(path), shards, shard]).permutation(len(records))
    return [records[i] for i in order.tolist()]


class _WriteShard(beam.DoFn):
    """Writes one output shard of one input file as gzipped TFRecords."""

    def __init__(self, split_uri: str, read: FeatureBatches, total: int) -> None:
        self._split_uri = split_uri
        self._read = read
        self._total = total

    def process(self, element: tuple[int, str, int, int]) -> Iterator[str]:
        import tensorflow as tf

        number, path, shard, shards = element
        target = os.path.join(
            self._split_uri, f"data_tfrecord-{number:05d}-of-{self._total:05d}.gz"
        )
        with tf.io.TFRecordWriter(target, options="GZIP") as writer:
            for record in shard_examples(path, self._read, shard=shard, shards=shards):
                writer.write(record)
        yield target


def _shard_tasks(files: list[str]) -> list[tuple[int, str, int, int]]:
    """(output number, input file, shard, shards of that file): one shard per
    SHARD_INPUT_BYTES of input, so that the examples a shard holds stay bounded."""
    tasks = []
    for path in files:
        shards = max(1, -(-fileio.stat(path).length // SHARD_INPUT_BYTES))
        tasks += [(len(tasks) + shard, path, shard, shards) for shard in range(shards)]
    return tasks


def _output_config(exec_properties: dict[str, Any]) -> Any:
    from tfx.proto import example_gen_pb2
    from tfx.utils import proto_utils

    value = exec_properties.get(standard_component_specs.OUTPUT_CONFIG_KEY)
    if value is None or isinstance(value, example_gen_pb2.Output):
        return value or example_gen_pb2.Output()
    return proto_utils.json_to_proto(value, example_gen_pb2.Output())


def writes_batches(exec_properties: dict[str, Any]) -> bool:
    """Whether the executor writes the output itself (gzipped TFRecords of tf.Examples, the
    input's splits): FileBasedExampleGen's defaults. Else the stock path writes it."""
    from tfx.proto import example_gen_pb2

    payload = exec_properties.get(standard_component_specs.OUTPUT_DATA_FORMAT_KEY)
    file_format = exec_properties.get(standard_component_specs.OUTPUT_FILE_FORMAT_KEY)
    return (
        not _output_config(exec_properties).split_config.splits
        and payload in (None, example_gen_pb2.FORMAT_TF_EXAMPLE)
        and file_format
        in (None, example_gen_pb2.FILE_FORMAT_UNSPECIFIED, example_gen_pb2.FORMAT_TFRECORDS_GZIP)
    )


class Executor(BaseExampleGenExecutor):
    """FileBasedExampleGen's executor for CSV and Parquet files, on Arrow record batches.

    Its `Do` writes each split as the stock executor does (gzipped TFRecords of tf.Examples,
    shuffled), without one Beam element per example: one element per output shard, each shard
    of an input file written by one pass over that file (`shard_examples`: its rows dealt at
    random, permuted whole). The stock WriteSplit's per-example Reshuffle cost more than the
    reading and encoding, and held every example of the split in memory on the DirectRunner;
    here a worker holds one shard's (SHARD_INPUT_BYTES of input). Any other output (Parquet
    payloads, hash-bucket output splits) goes through the stock path, one example per
    element.
    """

    def GetInputSourceToExamplePTransform(self) -> beam.PTransform:  # noqa: N802 - TFX's API
        return _ArrowToExample

    def Do(  # noqa: N802 - TFX's API
        self,
        input_dict: dict[str, list[Any]],
        output_dict: dict[str, list[Any]],
        exec_properties: dict[str, Any],
    ) -> None:
        from tfx.components.example_gen import utils
        from tfx.proto import example_gen_pb2
        from tfx.types import artifact_utils
        from tfx.utils import proto_utils

        input_config = example_gen_pb2.Input()
        proto_utils.json_to_proto(
            exec_properties[standard_component_specs.INPUT_CONFIG_KEY], input_config
        )
        if not writes_batches(exec_properties):
            super().Do(input_dict, output_dict, exec_properties)
            return
        output_config = _output_config(exec_properties)
        payload = exec_properties.get(standard_component_specs.OUTPUT_DATA_FORMAT_KEY)
        file_format = exec_properties.get(standard_component_specs.OUTPUT_FILE_FORMAT_KEY)
        self._log_startup(input_dict, output_dict, exec_properties)
        examples = output_dict[standard_component_specs.EXAMPLES_KEY]
        artifact = artifact_utils.get_single_instance(examples)
        artifact.split_names = artifact_utils.encode_split_names(
            utils.generate_output_split_names(input_config, output_config)
        )
        with self._make_beam_pipeline() as pipeline:
            for split in input_config.splits:
                files, read = _split_reader(exec_properties, split.pattern)
                tasks = _shard_tasks(files)
                split_uri = artifact_utils.get_split_uri(examples, split.name)
                fileio.makedirs(split_uri)
                _ = (
                    pipeline
                    | f"Shards[{split.name}]" >> beam.Create(tasks)
                    | f"Write[{split.name}]"
                    >> beam.ParDo(_WriteShard(split_uri, read, total=len(tasks)))
                )
        # The artifact's properties as the stock executor sets them.
        from tfx.components.example_gen import write_split
        from tfx.components.util import examples_utils

        for item in examples:
            if payload is not None:
                examples_utils.set_payload_format(item, payload)
            if file_format:
                examples_utils.set_file_format(item, write_split.to_file_format_str(file_format))


def example_gen(*, input_base: str, input_config: Any) -> Any:
    """The pipeline's ExampleGen node for staged CSV or Parquet splits."""
    from tfx.components import FileBasedExampleGen

    return FileBasedExampleGen(
        input_base=input_base,
        input_config=input_config,
        custom_executor_spec=executor_spec.BeamExecutorSpec(Executor),
    ).with_id(EXAMPLE_GEN_ID)
