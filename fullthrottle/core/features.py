"""Names shared by Transform, the Trainer and serving: one place decides them.

A column keeps the name the user wrote (the CSV header, the config, `predict_raw`'s inputs, REST
instances, `predict`'s CSV columns, MLflow params). Inside the model, TensorFlow and Keras need
names of their own: Keras refuses `/` in a layer name, a SavedModel refuses signature argument
names that are not graph node names (`a b`, `温度`) or Python keywords (`class`), TensorFlow
makes node names unique without regard to case (`Temp` and `temp` clash), and a vocabulary is a
file named after its column. `internal_name` maps every column name to a name that is safe in
all of those places:

- a name that is already safe (a lowercase ASCII letter, then lowercase letters, digits or `_`,
  at most `MAX_INTERNAL_LENGTH` characters, not a Python keyword) is kept as it is:
  `bill_length_mm`;
- any other name becomes its readable ASCII part plus 8 hex digits of its SHA-256, so two
  names that read alike stay apart: `od280/od315_of_diluted_wines` ->
  `od280_od315_of_diluted_wines_900f8f93`, `温度` -> `col_3732e264`, `class` ->
  `class_0889113e`, `Temp` -> `Temp_<8 hex>`, `a b` -> `a_b_c8687a08` (and `a_b` stays `a_b`).

The mapping is a pure function of the name (the same in Transform, the Trainer, serving and a
later run), and `check_internal_names` proves it one-to-one for a data spec: two columns that
would share an internal name are refused with both names in the message.
"""

from __future__ import annotations

import hashlib
import keyword
import re
import unicodedata
from collections.abc import Iterable

from fullthrottle.core.errors import ConfigError

# The label's vocabulary file. Internal names start with a letter, so no feature's vocabulary
# (`<internal name>_vocab`) can take this name, not even one of a column called "label".
LABEL_VOCAB = "_label_vocab"
# Unknown categories and unknown tokens share one out-of-vocabulary bucket each.
NUM_OOV_BUCKETS = 1
# Token id 0 is padding; vocabulary ids are shifted by one.
PAD_ID = 0
# Internal names stay well under file-name limits (255 bytes) with their suffixes.
MAX_INTERNAL_LENGTH = 64
_SAFE = re.compile(r"[a-z][a-z0-9_]*")
_DIGEST_CHARS = 8
# The readable part of a rewritten name: room for "_" and the digest.
_READABLE_CHARS = MAX_INTERNAL_LENGTH - _DIGEST_CHARS - 1


def is_safe_name(column: str) -> bool:
    """True when `column` can be used as it is inside TensorFlow and Keras."""
    return (
        len(column) <= MAX_INTERNAL_LENGTH
        and _SAFE.fullmatch(column) is not None
        and not keyword.iskeyword(column)
    )


def internal_name(column: str) -> str:
    """The TensorFlow/Keras-safe name of a column (see the module docstring)."""
    if is_safe_name(column):
        return column
    # Accents decompose to their base letter (Größe -> Groe, café -> cafe); other scripts leave
    # nothing readable behind and get the "col" prefix.
    ascii_text = unicodedata.normalize("NFKD", column).encode("ascii", "ignore").decode("ascii")
    readable = re.sub(r"[^A-Za-z0-9]+", "_", ascii_text).strip("_")
    if not readable[:1].isalpha():
        readable = f"col_{readable}" if readable else "col"
    readable = readable[:_READABLE_CHARS].rstrip("_")
    digest = hashlib.sha256(column.encode("utf-8")).hexdigest()[:_DIGEST_CHARS]
    return f"{readable}_{digest}"


def transformed_name(column: str) -> str:
    """The name of a column's Transform output (and of the model input that reads it)."""
    return f"{internal_name(column)}_xf"


def vocab_name(column: str) -> str:
    """The name of a column's vocabulary file in the Transform graph."""
    return f"{internal_name(column)}_vocab"


def check_internal_names(columns: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Column -> internal name for `(column, where)` pairs; refuses two columns on one name.

    `where` says where the column was named (`data.numeric`), for the message.

    Raises:
        ConfigError: two different columns map to the same internal name.
    """
    taken: dict[str, tuple[str, str]] = {}
    mapping: dict[str, str] = {}
    for column, where in columns:
        internal = internal_name(column)
        # Case-blind, as TensorFlow's node names are.
        other = taken.get(internal.lower())
        if other is not None and other[0] != column:
            raise ConfigError(
                f"columns {other[0]!r} (in `{other[1]}`) and {column!r} (in `{where}`) would both "
                f"be called {internal!r} inside the model (TensorFlow and Keras need names of "
                "ASCII letters, digits and '_', and tell them apart without regard to case). "
                "Rename one of them in the CSV header and the config."
            )
        taken[internal.lower()] = (column, where)
        mapping[column] = internal
    return mapping


def raw_input_keywords(loaded: object) -> dict[str, str]:
    """For a loaded pushed SavedModel: each `predict_raw` input column, as written, whose
    signature function takes another keyword -> that keyword (the internal name). Read from the
    model's `raw_input_names` function (written by `serving.signatures`); empty for a model
    whose columns are all safe names, or one without the table."""
    names = getattr(loaded, "raw_input_names", None)
    if names is None:
        return {}
    table = names()
    columns = [c.decode("utf-8") for c in table["column"].numpy()]
    internal = [c.decode("utf-8") for c in table["internal"].numpy()]
    return {c: i for c, i in zip(columns, internal, strict=True) if c != i}
