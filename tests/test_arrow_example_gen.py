"""The Arrow ExampleGen (components/arrow_example_gen.py) writes the examples TFX's stock
CsvExampleGen writes for the same CSV splits: both components run on real Beam in one pipeline,
on the staged bundled penguins data and on a CSV of awkward cells, and their examples are
compared split by split."""

from __future__ import annotations

import glob
import os

import pytest
import tensorflow as tf

from components.arrow_example_gen import (
    FLOAT,
    INT,
    STRING,
    UNKNOWN,
    InputError,
    encode_parquet_file,
    example_gen,
    infer_csv_kinds,
    writes_batches,
)
from fullthrottle.core.config import load_config
from fullthrottle.core.splits import SPLITS
from fullthrottle.core.staging import prepare_data

# Every kind of cell the stock inference and conversion treat specially: missing cells in each
# type, a column with no value at all, an int column with padded and signed cells, an integer
# beyond int64 (a STRING column), exponents, nan and inf, a quoted comma and a quoted line
# break, non-ASCII text.
AWKWARD_HEADER = "i,f,s,empty,big,padded,mixed\n"
AWKWARD_ROWS = [
    "1,1.5,plain,,1,3,1\n",
    ",,,,99999999999999999999, 4 ,2.5\n",
    '-7,1e5,"a, b",,2,+5,x\n',
    '0,nan,"two\nlines",,3,6,\n',
    "42,-inf,Zürich,,4,7,1e-3\n",
    "5,0.1,,,5,8,3\n",
]


def _input_config():
    from tfx import v1 as tfx

    return tfx.proto.Input(
        splits=[tfx.proto.Input.Split(name=name, pattern=f"{name}/*") for name in SPLITS]
    )


def _examples(pipeline_root: str, component: str, split: str) -> list[bytes]:
    files = glob.glob(
        os.path.join(pipeline_root, component, "examples", "*", f"Split-{split}", "*")
    )
    assert files, f"{component} wrote no {split} examples"
    return [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]


def _in_order(records: list[bytes]) -> list[bytes]:
    """Each example with its features in key order, in the order given."""
    return [tf.train.Example.FromString(r).SerializeToString(deterministic=True) for r in records]


def _canonical(records: list[bytes]) -> list[bytes]:
    """Each example with its features in key order (the one thing protobuf may write in another
    order: map entries), sorted; every value byte is compared."""
    return sorted(
        tf.train.Example.FromString(r).SerializeToString(deterministic=True) for r in records
    )


def _has_empty_feature(record: bytes) -> bool:
    features = tf.train.Example.FromString(record).features.feature.values()
    return any(not getattr(f, f.WhichOneof("kind")).value for f in features if f.WhichOneof("kind"))


@pytest.fixture(scope="module")
def both_example_gens(tmp_path_factory):
    """Stock CsvExampleGen and the Arrow ExampleGen, each on the staged penguins splits and on
    the awkward CSV, in one pipeline on Beam."""
    from tfx import v1 as tfx

    root = tmp_path_factory.mktemp("example_gens")
    config = load_config(overrides=[f"output_dir={root / 'out'}"])
    penguins = prepare_data(config).input_base
    awkward = root / "awkward"
    for split in SPLITS:
        (awkward / split).mkdir(parents=True)
        # train gets every row, eval the first three: types are inferred per split.
        rows = AWKWARD_ROWS if split == "train" else AWKWARD_ROWS[:3]
        (awkward / split / "data.csv").write_text(AWKWARD_HEADER + "".join(rows), encoding="utf-8")
    components = []
    for name, base in (("penguins", penguins), ("awkward", str(awkward))):
        components.append(
            tfx.components.CsvExampleGen(input_base=base, input_config=_input_config()).with_id(
                f"Stock_{name}"
            )
        )
        components.append(
            example_gen(input_base=base, input_config=_input_config()).with_id(f"Arrow_{name}")
        )
    pipeline_root = str(root / "pipeline")
    tfx.orchestration.LocalDagRunner().run(
        tfx.dsl.Pipeline(
            pipeline_name="arrow-vs-stock",
            pipeline_root=pipeline_root,
            components=components,
            enable_cache=False,
            metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
                str(root / "metadata.sqlite")
            ),
        )
    )
    return pipeline_root, config


def test_the_pipelines_node_takes_the_batch_writing_path():
    # FileBasedExampleGen's defaults (TFRecords of tf.Examples, gzipped) are what the executor
    # writes itself; anything else would go through the stock per-example path.
    node = example_gen(input_base="in", input_config=_input_config())
    assert writes_batches(node.exec_properties)


@pytest.mark.parametrize("data", ["penguins", "awkward"])
@pytest.mark.parametrize("split", SPLITS)
def test_examples_are_the_stock_components_examples(both_example_gens, data, split):
    pipeline_root, _ = both_example_gens
    stock = _examples(pipeline_root, f"Stock_{data}", split)
    ours = _examples(pipeline_root, f"Arrow_{data}", split)
    assert len(ours) == len(stock)
    assert _canonical(ours) == _canonical(stock)
    if data == "penguins":
        # The staged penguins data has missing cells (in both splits): empty value lists.
        assert any(_has_empty_feature(r) for r in stock)
    # The raw bytes differ from the stock component's at most in the order of the features.
    assert sorted(map(len, ours)) == sorted(map(len, stock))


def test_types_are_inferred_over_every_cell_as_stock(both_example_gens, tmp_path):
    pipeline_root, _ = both_example_gens
    train = os.path.join(os.path.dirname(pipeline_root), "awkward", "train", "data.csv")
    names = AWKWARD_HEADER.strip().split(",")
    kinds = dict(zip(names, infer_csv_kinds([train], names), strict=True))
    assert kinds == {
        "i": INT,
        "f": FLOAT,
        "s": STRING,
        "empty": UNKNOWN,
        "big": STRING,
        "padded": INT,
        "mixed": STRING,
    }
    example = tf.train.Example.FromString(
        next(r for r in _examples(pipeline_root, "Arrow_awkward", "train") if b"lines" in r)
    )
    features = example.features.feature
    assert features["s"].bytes_list.value == [b"two\nlines"]
    assert features["empty"].WhichOneof("kind") is None
    assert features["mixed"].WhichOneof("kind") == "bytes_list"
    assert not features["mixed"].bytes_list.value


def test_parquet_columns_keep_their_types_and_nulls_are_missing(tmp_path):
    import pandas as pd

    path = tmp_path / "part.parquet"
    pd.DataFrame(
        {
            "n": pd.array([1, None, 3], dtype="Int64"),
            "x": [0.5, None, 2.25],
            "s": ["a", None, "c"],
        }
    ).to_parquet(path)
    examples = [
        tf.train.Example.FromString(r) for batch in encode_parquet_file(str(path)) for r in batch
    ]
    rows = [
        (f["n"].int64_list.value[:], f["x"].float_list.value[:], f["s"].bytes_list.value[:])
        for f in (e.features.feature for e in examples)
    ]
    assert rows == [([1], [0.5], [b"a"]), ([], [], []), ([3], [2.25], [b"c"])]


def test_a_parquet_column_of_another_type_is_refused_with_its_name(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, values in (("struct", [{"a": 1}]), ("nested", [[[1, 2]]])):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"ok": [1], "tags": values}), path)
        with pytest.raises(InputError, match="column 'tags'"):
            list(encode_parquet_file(str(path)))


def test_a_parquet_list_column_is_a_feature_of_its_values(tmp_path):
    """Lists of one level (what staging writes: one value per cell, a null list missing) are
    features of their values; a null list has none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "lists.parquet"
    tags = pa.array([["a", "b"], None, [], ["c"]], pa.list_(pa.string()))
    counts = pa.array([[0], None, [3], [1]], pa.large_list(pa.int32()))
    pq.write_table(pa.table({"tags": tags, "count": counts}), path)
    examples = [
        tf.train.Example.FromString(r).features.feature
        for batch in encode_parquet_file(str(path))
        for r in batch
    ]
    assert [list(e["tags"].bytes_list.value) for e in examples] == [[b"a", b"b"], [], [], [b"c"]]
    assert [list(e["count"].int64_list.value) for e in examples] == [[0], [], [3], [1]]


def _run_example_gen(input_base: str, root) -> list[str]:
    """Runs the pipeline's ExampleGen node alone, cache on; its executions' states so far."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2
    from tfx import v1 as tfx

    connection = tfx.orchestration.metadata.sqlite_metadata_connection_config(
        str(root / "metadata.sqlite")
    )
    tfx.orchestration.LocalDagRunner().run(
        tfx.dsl.Pipeline(
            pipeline_name="arrow-cache",
            pipeline_root=str(root / "pipeline"),
            components=[example_gen(input_base=input_base, input_config=_input_config())],
            enable_cache=True,
            metadata_connection_config=connection,
        )
    )
    store = metadata_store.MetadataStore(connection)
    names = metadata_store_pb2.Execution.State.Name
    return [names(e.last_known_state) for e in sorted(store.get_executions(), key=lambda e: e.id)]


def test_unchanged_input_is_cached_and_a_changed_file_runs_again(tmp_path):
    base = tmp_path / "input"
    for split in SPLITS:
        (base / split).mkdir(parents=True)
        (base / split / "data.csv").write_text(AWKWARD_HEADER + "".join(AWKWARD_ROWS))
    assert _run_example_gen(str(base), tmp_path) == ["COMPLETE"]
    assert _run_example_gen(str(base), tmp_path) == ["COMPLETE", "CACHED"]
    with open(base / "eval" / "data.csv", "a", encoding="utf-8") as f:
        f.write("9,9.5,new,,9,9,9\n")
    assert _run_example_gen(str(base), tmp_path) == ["COMPLETE", "CACHED", "COMPLETE"]


def test_the_shards_of_a_file_hold_each_of_its_examples_once(tmp_path):
    import functools

    from components.arrow_example_gen import csv_feature_batches, encode_csv_file, shard_examples

    path = tmp_path / "data.csv"
    rows = [f"{i},{i / 2},name {i % 7}\n" for i in range(5000)]
    path.write_text("i,f,s\n" + "".join(rows), encoding="utf-8")
    names = ["i", "f", "s"]
    kinds = infer_csv_kinds([str(path)], names)
    read = functools.partial(csv_feature_batches, names=names, kinds=kinds)
    # Compared parsed (the encoder's feature order inside an example varies between calls).
    in_file = _in_order([r for batch in encode_csv_file(str(path), names, kinds) for r in batch])
    shards = [_in_order(shard_examples(str(path), read, shard=k, shards=3)) for k in range(3)]
    assert all(len(shard) > 1000 for shard in shards)  # dealt at random, about a third each
    assert sorted(r for shard in shards for r in shard) == sorted(in_file)
    # Each pass over the file draws the same: a shard written again is the same shard.
    assert _in_order(shard_examples(str(path), read, shard=1, shards=3)) == shards[1]
    # Permuted: not in the file's order.
    position = {r: i for i, r in enumerate(in_file)}
    assert shards[0] != sorted(shards[0], key=position.__getitem__)
