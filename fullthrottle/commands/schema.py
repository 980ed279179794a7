"""`fullthrottle schema`: a starting schema for your own data, inferred by TFDV.

The inferred schema describes the data it was computed from (types, presence, the values seen in
string columns), so validating that same data against it finds nothing. Curate it before relying
on it as a gate: widen or narrow domains, add value ranges (`float_domain { min max }`), relax
presence. Then point `data.schema_path` at it. `fullthrottle/core/bundled_data/penguins.pbtxt` is the
curated example for the bundled data.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from fullthrottle.commands.options import add_config_arguments, config_from_args
from fullthrottle.core import exit_status
from fullthrottle.core.errors import DataError
from fullthrottle.core.scratch import scratch_tempdir


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "schema",
        help="infer a starting schema.pbtxt for your data (to curate, then set data.schema_path)",
        description=(
            "Reads the configured data (the same checks as `fullthrottle run`), computes statistics "
            "with TensorFlow Data Validation and writes the schema it infers as text. Curate it "
            "(value ranges, domains, presence), then use it with --set data.schema_path=FILE: "
            "the data gate stops runs whose data does not match it."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle schema --data my.csv --output schema.pbtxt\n"
            "  fullthrottle schema --config my.yaml --output schema.pbtxt --force"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--output", required=True, metavar="FILE", help="where to write schema.pbtxt"
    )
    parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    return parser


def infer_schema_text(config: Any, *, work_dir: str) -> str:
    """Stages the configured data under `work_dir`, computes TFDV statistics, returns the schema.

    Uses the same inference as the pipeline's SchemaGen (`infer_feature_shape=True`), so a schema
    written here and imported with `data.schema_path` gives Transform the same feature shapes.
    """
    import tensorflow_data_validation as tfdv
    from google.protobuf import text_format

    from fullthrottle.core.splits import SPLITS
    from fullthrottle.core.staging import STAGED_CSV, STAGED_PARQUET, prepare_data

    staged = dataclasses.replace(config, output_dir=work_dir)
    prepared = prepare_data(staged)
    # Beam's default runner here is the DirectRunner; in_memory is fastest on small data.
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(["--direct_running_mode=in_memory"])
    if config.data.format == "csv":
        stats = tfdv.generate_statistics_from_csv(
            data_location=os.path.join(prepared.input_base, "*", STAGED_CSV),
            pipeline_options=options,
        )
    elif config.data.format == "parquet":
        # The staged files hold single-value list columns, the Arrow form TFDV reads.
        import apache_beam as beam
        import pyarrow.parquet as pq

        batches = [
            batch
            for split in SPLITS
            for batch in pq.read_table(
                os.path.join(prepared.input_base, split, STAGED_PARQUET)
            ).to_batches()
        ]
        output = os.path.join(work_dir, "parquet_stats.tfrecord")
        with beam.Pipeline(options=options) as pipeline:
            _ = (
                pipeline
                | beam.Create(batches, reshuffle=False)
                | tfdv.GenerateStatistics()
                | tfdv.WriteStatisticsToTFRecord(output)
            )
        stats = tfdv.load_statistics(output)
    else:
        stats = tfdv.generate_statistics_from_tfrecord(
            data_location=os.path.join(prepared.input_base, "*"), pipeline_options=options
        )
    schema = tfdv.infer_schema(stats, infer_feature_shape=True)
    sources = ", ".join(prepared.source_files)
    header = (
        f"# Inferred by `fullthrottle schema` from {sources}.\n"
        "# A starting point: curate domains, value ranges (float_domain/int_domain min, max) and\n"
        "# presence before using it as the data gate's contract (data.schema_path).\n"
    )
    return header + text_format.MessageToString(schema)


def run(args: argparse.Namespace) -> int:
    output = Path(args.output)
    if output.exists() and not args.force:
        raise DataError(
            f"{output} already exists; choose another --output or pass --force to overwrite it"
        )
    if not output.parent.exists():
        raise DataError(f"the folder of --output {output} does not exist; create it first")
    config = config_from_args(args)
    # The staged data, and the temp folders Beam and TFDV leave, go with the scratch folder.
    with scratch_tempdir(prefix="fullthrottle-schema-") as work_dir:
        text = infer_schema_text(config, work_dir=work_dir)
    # Written beside the target and renamed, so a failed write never leaves half a schema.
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, output)
    print(
        f"fullthrottle: wrote {output}; curate it, then use --set data.schema_path={output}",
        file=sys.stderr,
    )
    return exit_status.SUCCESS
