"""Curated schemas shipped with fullthrottle: the data gate's contract for bundled data.

`penguins.pbtxt` describes the bundled Palmer Penguins CSV (see the comments in the file for
how it was curated). A run on bundled data uses it unless `data.schema_path` names another.
"""

from __future__ import annotations

from pathlib import Path

from fullthrottle.config import BUNDLED_PENGUINS, DataSpec

SCHEMAS_DIR = Path(__file__).resolve().parent
PENGUINS_SCHEMA = SCHEMAS_DIR / "penguins.pbtxt"


def schema_path_for(spec: DataSpec) -> str | None:
    """The schema a run imports: `data.schema_path`, else the curated one for bundled penguins.

    None means "infer one with SchemaGen from the data itself" (which finds no anomalies in
    that same data: the gate then only guards against what SchemaGen's inference flags).
    """
    if spec.schema_path:
        return spec.schema_path
    if spec.path == BUNDLED_PENGUINS:
        return str(PENGUINS_SCHEMA)
    return None
