"""Names shared by Transform, the Trainer and serving: one place decides them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LABEL_VOCAB = "label_vocab"
# Unknown categories and unknown tokens share one out-of-vocabulary bucket each.
NUM_OOV_BUCKETS = 1
# Token id 0 is padding; vocabulary ids are shifted by one.
PAD_ID = 0


def transformed_name(column: str) -> str:
    return f"{column}_xf"


def vocab_name(column: str) -> str:
    return f"{column}_vocab"


def data_spec_from_custom_config(custom_config: Mapping[str, Any] | None):
    """Rebuilds the validated `DataSpec` that the pipeline put into a component's custom_config."""
    from fullthrottle.core.config import DataSpec, validate_section

    if not custom_config or "data" not in custom_config:
        raise ValueError("custom_config must carry the `data` spec (set by pipelines.pipeline)")
    return validate_section(DataSpec, custom_config["data"], where="data")
