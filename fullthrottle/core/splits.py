"""How input rows are split into the train and eval splits, and which classes each split holds.

CSV input is split by `fullthrottle run` itself when it stages the data, stratified by label:
within each class the rows are ordered by a hash of their content (stable across runs and
machines, independent of the row order in the file) and the first ones go to eval, the class's
share of `data.eval_buckets` out of `data.train_buckets + data.eval_buckets` rounded half up, at
most all rows but one. Every class keeps at least one row in train, so the label vocabulary
(analyzed over train by Transform) holds every class the Evaluator meets; a class with too few
rows for both splits is trained on and never evaluated, and is reported.

TFRecord input is not staged: ExampleGen splits it by hash buckets. `hash_split` says where
ExampleGen puts a record (TFX's `_PartitionFn`: sha256 of the record's bytes modulo the bucket
total, the first `train_buckets` buckets to train), so a class that would have rows in eval and
none in train is known before any component runs.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SPLITS = ("train", "eval")
STRATIFIED = "stratified by label"
STRATIFIED_RANGE = "stratified by label range"  # a regression label: ranges of its sorted values
HASH_BUCKETS = "by hash buckets"
SPLIT_FOLDERS = "from the `train/` and `eval/` folders"  # CSV data as ExampleGen reads it


def eval_rows_for(count: int, *, train_buckets: int, eval_buckets: int) -> int:
    """How many of a class's `count` rows go to eval: its share rounded half up, leaving at least
    one row in train."""
    total = train_buckets + eval_buckets
    share = (2 * count * eval_buckets + total) // (2 * total)
    return max(0, min(share, count - 1))


def row_key(cells: Sequence[str]) -> bytes:
    """A stable hash of a row's cells: the order of rows within a class."""
    return hashlib.sha256("\x1f".join(cells).encode("utf-8")).digest()


def row_key64(cells: Sequence[str]) -> int:
    """The first 8 bytes of `row_key`, as an unsigned integer in the same order: what staging
    keeps per row (8 bytes, whatever the row's width) to split input larger than memory."""
    return int.from_bytes(row_key(cells)[:8], "big")


def eval_mask(strata: Any, keys: Any, *, train_buckets: int, eval_buckets: int) -> Any:
    """Each row's split, as a boolean array (True: eval): `strata` holds an integer per row (its
    class, or its range of a regression label: `range_strata_array`), `keys` its `row_key64`.
    Within a stratum, rows go to eval in the order of their keys (ties keep their order in the
    file), `eval_rows_for` of them."""
    import numpy as np

    strata = np.asarray(strata)
    rows = len(strata)
    order = np.lexsort((np.asarray(keys, dtype=np.uint64), strata))  # stable: ties by row
    ordered = strata[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if rows else np.array([], int)
    counts = np.diff(np.r_[starts, rows])
    to_eval = np.array(
        [
            eval_rows_for(int(c), train_buckets=train_buckets, eval_buckets=eval_buckets)
            for c in counts
        ],
        dtype=np.int64,
    )
    rank = np.arange(rows) - np.repeat(starts, counts)
    mask = np.zeros(rows, dtype=bool)
    mask[order] = rank < np.repeat(to_eval, counts)
    return mask


def range_strata_array(values: Any, *, train_buckets: int, eval_buckets: int) -> Any:
    """A regression label's stratum of each row, from an array of its numbers: the values sorted
    and cut into runs of 5 x (train_buckets + eval_buckets) rows, so that each run of the label's
    range gets its share of eval (a distinct value per class would put most rows in train)."""
    import numpy as np

    size = 5 * (train_buckets + eval_buckets)
    order = np.argsort(np.asarray(values, dtype=np.float64), kind="stable")
    strata = np.empty(len(order), dtype=np.int64)
    strata[order] = np.arange(len(order)) // size
    return strata


def hash_split(record: bytes, *, train_buckets: int, eval_buckets: int) -> str:
    """The split TFX's ExampleGen gives a serialized record under hash buckets (no
    `partition_feature_name`): sha256 of the bytes modulo the bucket total."""
    bucket = int(hashlib.sha256(record).hexdigest(), 16) % (train_buckets + eval_buckets)
    return "train" if bucket < train_buckets else "eval"


@dataclass(frozen=True)
class SplitSummary:
    """Rows per split and per class: what the run trains and evaluates on."""

    method: str  # STRATIFIED or HASH_BUCKETS
    label: str
    class_rows: Mapping[str, Mapping[str, int]]  # class (or range, or "all") -> split -> rows
    classes: bool = True  # False for a regression label: no class can be left out of a split

    @classmethod
    def count(
        cls, *, method: str, label: str, pairs: Iterable[tuple[str, str]], classes: bool = True
    ) -> SplitSummary:
        """From `(class, split)` pairs, one per row."""
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        for value, split in pairs:
            counts[value][split] += 1
        return cls(
            method=method,
            label=label,
            class_rows={
                value: {split: counts[value][split] for split in SPLITS} for value in sorted(counts)
            },
            classes=classes,
        )

    def rows(self, split: str) -> int:
        return sum(rows[split] for rows in self.class_rows.values())

    def _only_in(self, split: str) -> dict[str, int]:
        """Classes with rows in `split` and none in the other, with their row counts."""
        if not self.classes:
            return {}
        (other,) = (name for name in SPLITS if name != split)
        return {
            value: rows[split]
            for value, rows in self.class_rows.items()
            if rows[split] and not rows[other]
        }

    @property
    def not_evaluated(self) -> dict[str, int]:
        """Classes with rows in train and none in eval, with their row counts."""
        return self._only_in("train")

    @property
    def not_trained(self) -> dict[str, int]:
        """Classes with rows in eval and none in train, with their row counts."""
        return self._only_in("eval")

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "rows": {split: self.rows(split) for split in SPLITS},
            "classes": len(self.class_rows) if self.classes else None,
            "classes_not_evaluated": self.not_evaluated,
            "classes_not_trained": self.not_trained,
        }

    def describe(self) -> str:
        """One line: how the rows were split."""
        line = (
            f"split {self.method}: {self.rows('train')} train rows, {self.rows('eval')} eval rows"
        )
        if not self.classes:
            return f"{line} (a regression label, {self.label!r})"
        return f"{line}, {len(self.class_rows)} classes of {self.label!r}"

    def rare_classes_message(self) -> str | None:
        """The classes too rare to be in both splits, or None when there are none."""
        rare = self.not_evaluated
        if not rare:
            return None
        return (
            f"{len(rare)} class{'es' if len(rare) != 1 else ''} of {self.label!r} "
            f"ha{'ve' if len(rare) != 1 else 's'} too few rows to be in both splits: trained on, "
            f"never evaluated: {name_classes(rare)}. Add rows of "
            f"{'them' if len(rare) != 1 else 'it'} for the evaluation to measure "
            f"{'them' if len(rare) != 1 else 'it'}."
        )


def name_classes(classes: Mapping[str, int], *, limit: int = 20) -> str:
    """`'a' (1 row), 'b' (3 rows)`, the rarest first, at most `limit` named."""
    ordered = sorted(classes.items(), key=lambda item: (item[1], item[0]))
    shown = ", ".join(
        f"{value!r} ({rows} row{'s' if rows != 1 else ''})" for value, rows in ordered[:limit]
    )
    more = len(ordered) - limit
    return shown + (f" and {more} more" if more > 0 else "")
