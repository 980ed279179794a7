"""Column names as users write them, and the internal names TensorFlow and Keras get."""

from __future__ import annotations

import keyword
import re

import pytest

from fullthrottle.core.config import DataSpec, load_config
from fullthrottle.core.errors import ConfigError
from fullthrottle.core.features import (
    LABEL_VOCAB,
    MAX_INTERNAL_LENGTH,
    internal_name,
    transformed_name,
    vocab_name,
)

# Names seen in real exports: every kind of character the issue lists, mixed, very long, and
# names that read alike once sanitized.
AWKWARD = (
    "od280/od315_of_diluted_wines",
    "bill length (mm)",
    "1st.flipper-length",
    "温度",
    "Körpermasse (g)",
    "Temp",
    "temp",
    "TEMP",
    "class",
    "None",
    "a b",
    "a-b",
    "a_b",
    "a.b",
    "🐧 count",
    "x:y",
    "#id",
    "$price",
    ".hidden",
    "__dunder",
    'quote"name',
    "measurement_" + "very_" * 40 + "long",
    "measurement_" + "very_" * 40 + "long!",
)


def test_safe_names_are_kept_as_they_are():
    for name in ("bill_length_mm", "species", "x1", "label", "a_b"):
        assert internal_name(name) == name
    assert transformed_name("bill_length_mm") == "bill_length_mm_xf"


def test_every_name_maps_to_a_distinct_safe_stable_internal_name():
    internal = [internal_name(name) for name in AWKWARD]
    for name, inner in zip(AWKWARD, internal, strict=True):
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", inner), (name, inner)
        assert len(inner) <= MAX_INTERNAL_LENGTH and not keyword.iskeyword(inner), inner
        assert internal_name(name) == inner  # a pure function: the same in every component
    # Distinct even without regard to case: TensorFlow's node names are case-blind.
    assert len({inner.lower() for inner in internal}) == len(AWKWARD)
    # Readable where the name has something readable.
    assert internal_name("od280/od315_of_diluted_wines").startswith("od280_od315_of_diluted_wines_")
    assert internal_name("Körpermasse (g)").startswith("Korpermasse_g_")


def test_the_label_vocabulary_cannot_be_taken_by_a_column_called_label():
    assert vocab_name("label") != LABEL_VOCAB
    assert all(vocab_name(name) != LABEL_VOCAB for name in AWKWARD)


def test_a_data_spec_with_every_awkward_name_is_valid():
    spec = DataSpec(label="Species name/Art", numeric=AWKWARD, categorical=())
    assert spec.feature_columns == AWKWARD


def test_two_columns_that_would_share_an_internal_name_are_refused_naming_both():
    twin = internal_name("a b")  # a safe name equal to another column's internal name
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=[f'data.numeric=["a b", {twin}]', "data.categorical=[]"])
    message = str(refused.value)
    assert "'a b' (in `data.numeric`)" in message and f"{twin!r} (in `data.numeric`)" in message
    assert "Rename one of them" in message
    # Case-blind: a lowercase spelling of an internal name clashes too.
    with pytest.raises(ConfigError, match="would both be called"):
        DataSpec(label="y", numeric=("Temp", internal_name("Temp").lower()), categorical=())
