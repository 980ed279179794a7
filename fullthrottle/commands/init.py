"""`fullthrottle init`: a commented, editable config for the user's own data, inferred from a sample.

Owns: turning an `Inference` (fullthrottle/core/columns.py) into YAML whose comments explain each
field and each decision, and writing it only after `load_config` accepts it. Refuses to overwrite
an existing file unless `--force` is given (nothing good is overwritten).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import shlex
import sys
import textwrap
from fractions import Fraction
from pathlib import Path
from typing import Any

from fullthrottle.core import exit_status
from fullthrottle.core.errors import ConfigError
from fullthrottle.core.launcher import command_as_typed
from fullthrottle.core.paths import hidden_reason, shown_because_named
from trainer_module.training.config import TrainingConfig

DEFAULT_OUTPUT = "fullthrottle.yaml"
# Column names in the printed table are clipped to this width.
NAME_WIDTH = 40


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "init",
        help="write a commented config for your own CSV or Parquet (or TFRecord folder)",
        description=(
            "Reads a sample of your data, decides for each column whether it is numeric, "
            "categorical or free text (or drops it, with the reason), and writes a commented YAML "
            "config you can edit. Then `fullthrottle run --config FILE` trains on it."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle init --data reviews.csv --label rating\n"
            "  fullthrottle init --data reviews.csv --label rating --text title --output reviews.yaml\n"
            "  fullthrottle run --config reviews.yaml --set training.train_steps=200"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data",
        required=True,
        metavar="PATH",
        help="a CSV or Parquet file, or a folder of CSV, Parquet or TFRecord files",
    )
    parser.add_argument(
        "--label",
        required=True,
        metavar="COLUMN",
        help="the column to predict (a class, or a number for regression)",
    )
    parser.add_argument(
        "--task",
        choices=("classification", "regression"),
        default=None,
        help="what the label is, whatever the sample suggests (default: decided from the label's "
        "values: many distinct or fractional numbers are a regression target)",
    )
    parser.add_argument(
        "--text",
        action="append",
        default=[],
        metavar="COLUMN",
        help="treat COLUMN as free text whatever the heuristics say (repeatable)",
    )
    parser.add_argument(
        "--output",
        default=DEFAULT_OUTPUT,
        metavar="FILE",
        help=f"config file to write (default: {DEFAULT_OUTPUT})",
    )
    parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    parser.add_argument(
        "--sample-rows",
        type=int,
        default=None,
        metavar="N",
        help="rows (or records) to read for the inference (default: 20000)",
    )
    return parser


def _scalar(value: Any) -> str:
    """A YAML flow scalar / list (JSON is valid YAML, and quotes whatever needs quoting)."""
    return json.dumps(value, ensure_ascii=False)


def _name_from(path: Path) -> str:
    stem = path.stem if path.is_file() else path.name
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", stem).strip("-_") or "data"
    return name[:40]


def _comment(text: str) -> str:
    # A value taken from the data must not break out of its comment line.
    return text.replace("\n", " ").replace("\r", " ")


def majority_threshold(label_classes: tuple[tuple[str, int], ...]) -> float:
    """The most frequent class's share of the labelled rows, rounded up to three decimals in
    exact arithmetic (399 of 1000 is 0.399, 1 of 3 is 0.334: never below the share)."""
    total = sum(count for _, count in label_classes)
    share = Fraction(label_classes[0][1], total)
    return float(Fraction(math.ceil(share * 1000), 1000))


def render_config(inference: Any, *, config_path: Path) -> str:
    """The YAML text: every field `init` sets, each with a comment saying what it means."""
    name = _name_from(inference.path)
    try:
        data_path = os.path.relpath(inference.path.resolve(), config_path.resolve().parent)
    except ValueError:  # another drive (Windows): keep it absolute
        data_path = str(inference.path.resolve())
    label_report = inference.report(inference.label)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# fullthrottle config for {inference.path}",
        f"# written by `fullthrottle init` on {now} from {inference.rows_sampled} sampled rows of",
        f"# {inference.source_file}. Edit freely: fields not listed keep their defaults",
        "# (fullthrottle/core/config.py). Train with:",
        f"#   {shlex.join(['fullthrottle', *train_arguments(inference, config_path.name)])}",
        "# Override single fields on the command line (--set training.train_steps=2000) or pick a",
        "# hardware preset (--preset cpu | gpu | multi_gpu | multi_worker).",
        "",
        f"pipeline_name: {_scalar(name)}   # names the run in ML Metadata and under pipeline_root/",
        f"model_name: {_scalar(name)}      # pushed to <output_dir>/serving/<model_name>/<version>/",
        f"output_dir: {_scalar('runs/' + name)}   # relative to where you run fullthrottle",
        "",
    ]
    if inference.findings:
        lines.append(
            f"# NEEDS A DECISION: `fullthrottle run` stops on {len(inference.findings)} "
            "column(s) until the data or this file says what they are:"
        )
        for number, finding in enumerate(inference.findings, start=1):
            lines += textwrap.wrap(
                _comment(f"({number}) {finding}"),
                width=98,
                initial_indent="# ",
                subsequent_indent="#     ",
                break_on_hyphens=False,
            )
        lines.append("")
    lines += [
        "data:",
        "  # A CSV file or folder of CSVs, a Parquet file or folder of Parquet files (typed by",
        "  # their schema), or a folder of TFRecord files; relative to this file.",
        f"  path: {_scalar(data_path)}",
        f"  format: {inference.format}",
        "  # The column to predict.",
        f"  label: {_scalar(inference.label)}   # {_comment(label_report.reason)}",
        "  # classification: each distinct label value is a class; regression: the label is a",
        "  # number to predict (squared-error loss; judged on mean absolute error).",
        f"  task: {inference.task}   # {_comment(inference.task_reason)}",
        "  # numeric: every present cell is a number. Missing cells get the training mean, then",
        "  # each column is scaled to mean 0, variance 1.",
    ]

    def column_lines(key: str, names: tuple[str, ...]) -> None:
        if not names:
            lines.append(f"  {key}: []")
            return
        lines.append(f"  {key}:")
        for column in names:
            report = inference.report(column)
            missing = f"; {report.missing} missing" if report.missing else ""
            lines.append(f"    - {_scalar(column)}   # {_comment(report.reason)}{missing}")

    column_lines("numeric", inference.numeric)
    lines += [
        "  # categorical: a vocabulary of the values seen in training; unseen values share one",
        "  # out-of-vocabulary id, a missing cell is a value of its own.",
    ]
    column_lines("categorical", inference.categorical)
    lines += [
        "  # text: tokenized (word = split on spaces, char = one token per character, for CJK),",
        "  # cut to max_tokens, vocabulary of the vocab_size most frequent tokens. With a text",
        "  # column the model is a small Transformer; without, an MLP.",
    ]
    if not inference.text:
        lines.append("  text: []")
    else:
        lines.append("  text:")
        for settings in inference.text:
            report = inference.report(settings.name)
            lines += [
                f"    - name: {_scalar(settings.name)}   # {_comment(report.reason)}",
                f"      tokenizer: {settings.tokenizer}",
                f"      max_tokens: {settings.max_tokens}   # ~95th percentile of the token count",
                f"      vocab_size: {settings.vocab_size}",
            ]
    if inference.dropped:
        lines.append("  # Dropped by init (add a column above if you disagree):")
        for report in inference.dropped:
            lines.append(f"  #   {_comment(report.name)}: {_comment(report.reason)}")
    lines += [
        '  # CSV cells equal to one of these are missing values (in Parquet: nulls, NaN and "").',
        f"  na_values: {_scalar(list(inference.na_values))}",
        '  # How numbers are written in numeric columns: decimal "," reads 18,9 as 18.9;',
        '  # thousands "," reads 1,234 as 1234 (one of "," "." " " "\'", or null for none).',
        '  decimal: "."',
        "  thousands: null",
        '  # Label values that differ only in whitespace or case ("Adelie", "Adelie "): stop (say',
        "  # where they are), merge (into the most frequent spelling) or keep (different classes).",
        "  near_duplicate_labels: stop",
        "  # Rows are split train : eval in these shares (3 : 1 = 75% train): CSV and Parquet",
        "  # stratified by label (every class keeps a row in train), TFRecords by a record hash.",
        "  train_buckets: 3",
        "  eval_buckets: 1",
        "",
        "training:",
        "  # Optimizer steps; one step sees global_batch_size = per_replica_batch_size x replicas rows.",
        f"  train_steps: {TrainingConfig.train_steps}",
        "  per_replica_batch_size: 64",
        "  learning_rate: 0.001",
        "  # auto: mixed_bfloat16 on CPUs with AVX512_BF16/AMX, mixed_float16 on GPUs with tensor",
        "  # cores, float32 otherwise (`fullthrottle doctor` says what it picks here and why).",
        "  precision: auto",
        "  # auto: several workers (TF_CONFIG) > several GPUs (mirrored) > one device.",
        "  strategy: auto",
        "",
        "evaluation:",
        *_bar_lines(inference),
        "  # And, once a model of this pipeline was blessed, no worse than that model by more than",
        "  # baseline_tolerance (latest_blessed; none: the bar alone).",
        "  baseline: latest_blessed",
        "  baseline_tolerance: 0.0",
        "",
    ]
    return "\n".join(lines)


def max_mae_bar(median_mae: float) -> float:
    """The error of always answering the median, rounded down to 4 significant digits in exact
    arithmetic (never up: a bar above it would bless a model no better than the trivial one
    by more than the rounding)."""
    if median_mae <= 0:
        return 0.0
    exponent = math.floor(math.log10(median_mae)) - 3
    step = Fraction(10) ** exponent
    return float(math.floor(Fraction(median_mae) / step) * step)


def _bar_lines(inference: Any) -> list[str]:
    """The evaluation section's absolute bar, with the comment saying where it comes from."""
    if inference.task == "regression":
        bar = max_mae_bar(inference.median_mae)
        return [
            "  # The model is pushed only if its eval mean absolute error (in the label's units) is",
            "  # at most this. Set by init to the error of always answering the sample's median",
            f"  # label ({inference.median_mae:.6g}): the model must do at least as well as that.",
            "  # Lower it once you know what is achievable.",
            f"  max_mae: {bar!r}",
        ]
    majority_share = inference.majority_fraction
    # The bar to be pushed: at least as accurate as always answering the most frequent class,
    # rounded up (never down: a bar below that share would bless the trivial model).
    threshold = majority_threshold(inference.label_classes)
    return [
        "  # The model is pushed only if its eval accuracy reaches this. Set by init to the share of",
        f"  # the most frequent class in the sample ({majority_share:.1%}): the model must do at least as",
        "  # well as always answering that class. Raise it once you know what is achievable.",
        f"  accuracy_threshold: {threshold}",
    ]


def train_arguments(inference: Any, config_file: str | Path) -> list[str]:
    """`fullthrottle run` on the config written. Data that `bin/envrun`'s userland shows only
    because init's command line names it is named on this one too (a config file alone does
    not show it)."""
    arguments = ["run", "--config", str(config_file)]
    if shown_because_named(inference.path):
        arguments += ["--data", str(inference.path.resolve())]
    return arguments


def run(args: argparse.Namespace) -> int:
    from fullthrottle.core.columns import DEFAULT_SAMPLE_ROWS, infer_columns
    from fullthrottle.core.config import load_config

    output = Path(args.output)
    hidden = hidden_reason(output)
    if hidden is not None:
        raise ConfigError(f"--output {output} cannot be written: {hidden}")
    if output.exists() and not args.force:
        raise ConfigError(
            f"{output} already exists; init does not overwrite it. Pass --force to replace it, or "
            "--output to write somewhere else."
        )
    if output.exists() and output.is_dir():
        raise ConfigError(
            f"--output {output} is a folder; name a file such as {output / DEFAULT_OUTPUT}"
        )
    sample_rows = args.sample_rows or DEFAULT_SAMPLE_ROWS
    if sample_rows < 2:
        raise ConfigError(f"--sample-rows must be >= 2, got {sample_rows}")
    inference = infer_columns(
        args.data,
        label=args.label,
        text_columns=tuple(args.text),
        sample_rows=sample_rows,
        task=getattr(args, "task", None),
    )
    text = render_config(inference, config_path=output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        load_config(tmp)  # the file we hand out must load; a failure here is a bug in init
    except Exception:
        tmp.unlink()
        raise
    os.replace(tmp, output)

    out = sys.stdout
    out.write(f"fullthrottle init: read {inference.rows_sampled} rows of {inference.source_file}\n")
    width = min(NAME_WIDTH, max(len(c.name) for c in inference.columns))
    for report in inference.columns:
        shown = report.name if len(report.name) <= width else report.name[: width - 3] + "..."
        out.write(f"  {shown:<{width}}  {report.kind:<11}  {report.reason}\n")
    if inference.findings:
        out.write(
            f"fullthrottle init: {len(inference.findings)} column(s) need a decision before "
            "training; `fullthrottle run` stops on them until the data or the config says what "
            "they are:\n"
        )
        for number, finding in enumerate(inference.findings, start=1):
            out.write(f"  ({number}) {finding}\n")
        out.write(f"wrote {output} (the same notes are at its top). Decide, then train:\n")
    else:
        out.write(f"wrote {output}. Check it, then train:\n")
    out.write(f"  {command_as_typed(train_arguments(inference, output))}\n")
    return exit_status.SUCCESS
