"""The data gate: anomalies found by ExampleValidator stop the pipeline before Transform.

TFX's ExampleValidator only records anomalies (and marks its artifact "not blessed"); nothing
downstream looks at them. `DataGate` reads them and either fails with a readable report (split,
column, anomaly type, description, the input files) or passes the schema through unchanged as
its `validated_schema` output. Transform and Trainer take their schema from that output, so
they depend on the gate through data (lineage in ML Metadata, and no task-only edge, which TFX
documents as unreliable next to conditional nodes such as the Pusher's).

It also runs the cell checks of `fullthrottle.core.data_checks` on the data ExampleGen read, on
every run and every runner: numeric columns with cells that are not plain numbers (or typed as
text by the schema), label values written several ways, and label classes with rows in eval and
none in train stop the run here, with the values and where they are, so data that changed since
`fullthrottle init` (or was put where ExampleGen reads by other means) is caught before
Transform.

The component only unpacks artifacts; `read_anomalies`, `format_report` and `data_findings`
are tested on their own. Files go through TFX's filesystem layer (`fileio`), so artifacts on
gs:// or s3:// pipeline roots are read and written like local ones.
"""

# No `from __future__ import annotations`: TFX's @component reads the real annotation types.
import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.dsl.io import fileio
from tfx.types import standard_artifacts

from fullthrottle.core.data_checks import (
    Finding,
    LabelReport,
    NumberReport,
    report,
    report_findings,
)
from fullthrottle.core.errors import DataError

ANOMALIES_FILE = "SchemaDiff.pb"
SCHEMA_FILE = "schema.pbtxt"
# The report lists at most this many anomalies; the count says how many there were in all.
MAX_REPORTED = 20
# TFDV quotes offending values in its descriptions; a 100,000-character cell must not become a
# 100,000-character error message.
MAX_DESCRIPTION_CHARS = 300


@dataclass(frozen=True)
class Anomaly:
    """One anomaly of one column (or of the whole dataset, column "*") in one split."""

    split: str
    column: str
    anomaly_type: str  # the TFDV reason, e.g. ENUM_TYPE_UNEXPECTED_STRING_VALUES
    description: str  # TFDV's sentence, e.g. "Examples contain values missing from the schema: ..."


class DataGateError(DataError):
    """ExampleValidator found anomalies, or the cell checks found cells that need a decision:
    the run stops before Transform.

    `anomalies` and `findings` hold the structured rows (for trackers such as MLflow); the
    message is the readable report.
    """

    def __init__(
        self, message: str, anomalies: list[Anomaly], findings: list[Finding] | None = None
    ) -> None:
        super().__init__(message)
        self.anomalies = anomalies
        self.findings = findings or []


def read_anomalies(anomalies_uri: str, split_names: list[str]) -> list[Anomaly]:
    """Reads ExampleValidator's `Split-<name>/SchemaDiff.pb` files; refuses a missing one."""
    from tensorflow_metadata.proto.v0 import anomalies_pb2

    found: list[Anomaly] = []
    for split in split_names:
        path = os.path.join(anomalies_uri, f"Split-{split}", ANOMALIES_FILE)
        if not fileio.exists(path):
            raise DataError(
                f"the data gate found no anomalies file for split {split!r} at {path}; "
                "ExampleValidator's output is incomplete: rerun the pipeline"
            )
        with fileio.open(path, "rb") as f:
            found += anomalies_of_split(split, anomalies_pb2.Anomalies.FromString(f.read()))
    return found


def anomalies_of_split(split: str, proto: Any) -> list[Anomaly]:
    """The rows of one split's TFDV `Anomalies` proto (what ExampleValidator wrote for it)."""
    from tensorflow_metadata.proto.v0 import anomalies_pb2

    found: list[Anomaly] = []
    infos = sorted(proto.anomaly_info.items())
    if proto.HasField("dataset_anomaly_info"):
        infos.append(("*", proto.dataset_anomaly_info))
    for column, info in infos:
        reasons = list(info.reason) or [None]
        for reason in reasons:
            if reason is None:
                kind, text = "UNKNOWN_TYPE", info.description or info.short_description
            else:
                kind = anomalies_pb2.AnomalyInfo.Type.Name(reason.type)
                text = reason.description or reason.short_description
            found.append(
                Anomaly(split=split, column=column, anomaly_type=kind, description=text.strip())
            )
    return found


def data_findings(spec: Any, *, input_base: str, schema_types: dict[str, str]) -> list[Finding]:
    """The cell checks on the data ExampleGen read from `input_base` (see the module docstring)."""
    from fullthrottle.core.splits import SPLIT_FOLDERS, SplitSummary
    from fullthrottle.core.staging import input_label_splits, input_rows

    # A regression label is a number: checked as the numeric columns are, with no classes.
    regression = spec.task == "regression"
    numeric = (*spec.numeric, spec.label) if regression else spec.numeric
    numbers = {column: NumberReport(column) for column in numeric}
    labels = LabelReport(spec.label)
    splits: Counter[tuple[str, str]] = Counter()  # (label, split folder) -> rows
    # One pass over the rows, whatever the size of the data.
    for place, values in input_rows(
        input_base, data_format=spec.format, columns=[*spec.numeric, spec.label]
    ):
        for column, column_numbers in numbers.items():
            column_numbers.add(place, values[column])
        labels.add(place, values[spec.label])
        splits[values[spec.label], place.split("/", 1)[0]] += 1
    findings = report_findings(
        numbers=numbers,
        labels=labels,
        label_mode="keep" if regression else spec.near_duplicate_labels,
        types=schema_types,
    )
    if regression:
        return findings
    # The label's cells were read above: CSV and Parquet files are not read a second time.
    split = (
        SplitSummary.count(
            method=SPLIT_FOLDERS,
            label=spec.label,
            pairs=(pair for pair, rows in splits.items() for _ in range(rows)),
        )
        if spec.format in ("csv", "parquet")
        else input_label_splits(input_base, spec=spec)
    )
    unseen = eval_only_classes(split)
    return [*findings, unseen] if unseen else findings


def eval_only_classes(split: Any) -> Finding | None:
    """Classes with eval rows and no train rows: unknown to the label vocabulary (analyzed over
    train), they would fail the evaluation after training. `fullthrottle run` never stages such
    a split; data put where ExampleGen reads by other means can hold one."""
    from fullthrottle.core.splits import name_classes

    unseen = split.not_trained
    if not unseen:
        return None
    several = len(unseen) != 1
    return Finding(
        column=split.label,
        where="`data.label`",
        problem=(
            f"{len(unseen)} class{'es' if several else ''} with rows in the eval split and none "
            f"in train ({split.method}): {name_classes(unseen)}"
        ),
        fix=(
            f"The model could not learn {'them' if several else 'it'} and the evaluation would "
            "fail on them. CSV input: let `fullthrottle run` stage it (it splits stratified by "
            "label, every class keeps a row in train) and copy both split folders, `train/` and "
            "`eval/`. TFRecord input: add records of these classes, remove them, or export the "
            "data as CSV."
        ),
    )


def schema_types(schema_uri: str) -> dict[str, str]:
    """Column -> its type in the schema artifact ("INT", "FLOAT", "BYTES")."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    with fileio.open(os.path.join(schema_uri, SCHEMA_FILE), "r") as f:
        schema = text_format.Parse(f.read(), schema_pb2.Schema())
    return {feature.name: schema_pb2.FeatureType.Name(feature.type) for feature in schema.feature}


def format_report(
    anomalies: list[Anomaly],
    *,
    input_files: str,
    schema_source: str,
    findings: list[Finding] | None = None,
) -> str:
    """One paragraph a person can act on: what was found, where, and what to do."""
    if not anomalies:
        return (
            f"the data gate stopped the run: {report(findings or [], source=input_files)} "
            "Transform and Trainer did not run."
        )
    shown = anomalies[:MAX_REPORTED]
    items = "; ".join(
        f"split {a.split!r}, column {a.column!r}: {a.anomaly_type}: {_clip(a.description).rstrip('.')}"
        for a in shown
    )
    more = f" (and {len(anomalies) - len(shown)} more)" if len(anomalies) > len(shown) else ""
    also = f" Also, {report(findings, source='in that data')}" if findings else ""
    return (
        f"the data gate stopped the run: ExampleValidator found {len(anomalies)} "
        f"anomal{'y' if len(anomalies) == 1 else 'ies'} in {input_files} against the schema "
        f"{schema_source}: {items}{more}.{also} Transform and Trainer did not run. Fix the data, "
        "or, if the data is right and the schema is too strict, edit the schema "
        "(`data.schema_path`; `fullthrottle schema` writes a starting one)."
    )


def _clip(text: str) -> str:
    if len(text) <= MAX_DESCRIPTION_CHARS:
        return text
    return f"{text[:MAX_DESCRIPTION_CHARS]}... ({len(text)} characters)"


def describe_inputs(spec: Any, input_base: str) -> str:
    """Names the user's input files for the report (ExampleGen reads a staged copy of CSV and
    Parquet input)."""
    from fullthrottle.core.bundled import bundled_path

    try:
        original = str(bundled_path(spec.path))
    except DataError:
        original = spec.path
    if spec.format in ("csv", "parquet") and os.path.normpath(input_base) != os.path.normpath(
        original
    ):
        return f"{original} (staged for ExampleGen in {input_base})"
    return original


def file_digest(path: str) -> str:
    with fileio.open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@component
def ImportSchema(  # noqa: N802 - TFX names the component (and its node id) after the function
    schema: OutputArtifact[standard_artifacts.Schema],
    schema_file: Parameter[str],
    schema_digest: Parameter[str],
) -> None:
    """Imports a curated schema.pbtxt; refuses a file that changed since the pipeline was built.

    Used instead of TFX's ImportSchemaGen because that one's cache key is the file's path only:
    a schema edited in place would silently be replaced by the stale cached copy. Here the
    content digest is a parameter, so an edited schema is a cache miss.
    """
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    if file_digest(schema_file) != schema_digest:
        raise DataError(
            f"the schema {schema_file} (config field `data.schema_path`) changed while the "
            "pipeline was running; rerun to use the new version"
        )
    with fileio.open(schema_file, "r") as f:
        parsed = text_format.Parse(f.read(), schema_pb2.Schema())
    fileio.makedirs(schema.uri)
    # Downstream readers expect exactly one file in the artifact folder.
    with fileio.open(os.path.join(schema.uri, SCHEMA_FILE), "w") as f:
        f.write(text_format.MessageToString(parsed))


@component
def DataGate(  # noqa: N802 - TFX names the component (and its node id) after the function
    anomalies: InputArtifact[standard_artifacts.ExampleAnomalies],
    schema: InputArtifact[standard_artifacts.Schema],
    validated_schema: OutputArtifact[standard_artifacts.Schema],
    input_files: Parameter[str],
    schema_source: Parameter[str],
    input_base: Parameter[str],
    data_spec: Parameter[str],
) -> None:
    """Fails with `DataGateError` when there are anomalies or cells that need a decision
    (`data_spec`: the `DataSpec` as JSON; `input_base`: what ExampleGen read); otherwise
    passes the schema on."""
    from fullthrottle.core.config import data_spec_from_custom_config

    split_names = json.loads(anomalies.split_names or "[]")
    found = read_anomalies(anomalies.uri, split_names)
    spec = data_spec_from_custom_config({"data": json.loads(data_spec)})
    findings = data_findings(spec, input_base=input_base, schema_types=schema_types(schema.uri))
    if found or findings:
        raise DataGateError(
            format_report(
                found, input_files=input_files, schema_source=schema_source, findings=findings
            ),
            found,
            findings,
        )
    fileio.makedirs(validated_schema.uri)
    for name in fileio.listdir(schema.uri):
        source = os.path.join(schema.uri, name)
        if not fileio.isdir(source):
            fileio.copy(source, os.path.join(validated_schema.uri, name), overwrite=True)
