"""The docs' generated blocks: every benchmark figure the docs quote, written from
``bench/results/LATEST.json`` and the registry, never typed.

A block is the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in a page of
:data:`PAGES`; :data:`BLOCKS` says what each name renders to. A block whose text has several
lines (a table) sits on lines of its own; a one-line figure sits inside a sentence.
``fullthrottle bench`` rewrites them after a run on the repo's own results (and
``fullthrottle bench --docs`` without one); ``tests/test_docs.py`` fails when a page's block
differs from what ``LATEST.json`` renders to.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fullthrottle.bench.advisor_figures import FIGURES_FILE, update_figures
from fullthrottle.bench.benchmarks import BENCHMARKS
from fullthrottle.bench.benchmarks.base import REPO, entry_at
from fullthrottle.bench.results import LATEST, latest_markdown, replace_file

LATEST_JSON = REPO / "bench" / "results" / f"{LATEST}.json"
PAGES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
_BLOCK = re.compile(r"<!-- bench:([a-z0-9-]+) -->(.*?)<!-- /bench:\1 -->", re.DOTALL)


def _shown(value: Any) -> str:
    """A size as the sizes table shows it."""
    if value is None or value in ((), {}):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple):
        return ", ".join(f"{v:,}" for v in value)
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def targets_table(latest: Mapping[str, Any]) -> str:
    """Every registered target: its line and what it is measured as."""
    rows = ["| benchmark | target | line | measured as |", "|---|---|---|---|"]
    for spec in BENCHMARKS.values():
        for target in spec.targets:
            rows.append(
                f"| {spec.name} | `{target.name}` | {target.line:,g} | {target.measured_as} |"
            )
    return "\n".join(rows) + "\n"


def sizes_table(latest: Mapping[str, Any]) -> str:
    """Every benchmark's sizes in full and quick mode, and what each sizes."""
    rows = ["| benchmark | size | full | quick | what |", "|---|---|---|---|---|"]
    for spec in BENCHMARKS.values():
        for field in dataclasses.fields(spec.full):
            rows.append(
                f"| {spec.name} | `{field.name}` | {_shown(getattr(spec.full, field.name))} | "
                f"{_shown(getattr(spec.quick, field.name))} | {field.metadata.get('what', '')} |"
            )
    return "\n".join(rows) + "\n"


def _reading(latest: Mapping[str, Any], *path: str) -> Any:
    value = entry_at(latest.get("results"), *path)
    if value is None:
        raise KeyError(f"LATEST.json has no {'/'.join(path)}: run the benchmark that writes it")
    return value


def pipeline_wall(latest: Mapping[str, Any]) -> str:
    """The bundled run's wall time, as the pipeline benchmark measured it."""
    return f"{_reading(latest, 'pipeline', 'wall_seconds'):.0f} s"


def beam_scaling(latest: Mapping[str, Any]) -> str:
    """2 vs 1 Beam workers at the smallest and largest point of the Beam benchmark."""
    ratios = _reading(latest, "beam", "two_vs_one_workers")
    rows = sorted(ratios, key=int)
    low, high = rows[0], rows[-1]
    return f"{ratios[low]:.2f}x at {int(low):,} rows, {ratios[high]:.2f}x at {int(high):,}"


def _reader_per_core(latest: Mapping[str, Any]) -> dict[str, float]:
    streaming = ("trainer", "tabular", "streaming")
    return {
        source: _reading(latest, *streaming, key, "per_cpu_second", "median")
        for source, key in (("records", "reader"), ("pre-batched copies", "reader_prebatched"))
    }


def reader_per_core(latest: Mapping[str, Any]) -> str:
    """The streaming reader's tabular examples per CPU-second, from records and from copies."""
    rates = _reader_per_core(latest)
    return (
        f"{rates['records']:,.0f} tabular examples per CPU-second from the records, "
        f"{rates['pre-batched copies']:,.0f} from pre-batched copies"
    )


# A published per-GPU training rate of a tabular model (NVIDIA DeepLearningExamples, Wide & Deep,
# TensorFlow 2, 1x A100 80GB, batch 131,072, samples/s): TF32 without XLA, and mixed precision
# with XLA (docs/performance.md cites the source).
WIDE_AND_DEEP_A100 = (1_269_638, 1_997_414)


def wide_and_deep_a100(latest: Mapping[str, Any]) -> str:
    """The published A100 rates the input-cores table divides by (one source: the constant)."""
    low, high = WIDE_AND_DEEP_A100
    return f"TF32 without XLA {low:,} samples/s; mixed precision + XLA {high:,}"


def loop_vs_fit(latest: Mapping[str, Any]) -> str:
    """Our loop / a strong `fit` given the same options, per model: the ratio the target is
    judged on (the lower of the ratio of medians and the paired median) and its interval; a
    reading from before `fit` got ours' distribution setup says so."""
    parts = []
    for model in ("transformer", "tabular"):
        entry = _reading(latest, "trainer", model, "vs_strong_fit")
        value = min(entry["ratio"], entry.get("paired_median", entry["ratio"]))
        notes = []
        interval = entry.get("paired_interval")
        if interval:
            notes.append(
                f"{interval['coverage']:.0%} interval {interval['low']:.2f}-{interval['high']:.2f}"
            )
        if "distribution" not in entry.get("fit", {}):
            notes.append("`fit` paying for a distributed iterator ours skips")
        parts.append(f"{model} {value:.2f}x" + (f" ({'; '.join(notes)})" if notes else ""))
    return ", ".join(parts)


def input_cores_per_gpu(latest: Mapping[str, Any]) -> str:
    """Input cores per GPU at Wide & Deep's published A100 rates, at the reader's latest rates."""
    low, high = WIDE_AND_DEEP_A100
    rows = [
        "| the reader reads | tabular examples per CPU-second | input cores per GPU |",
        "|---|---|---|",
    ]
    for source, rate in _reader_per_core(latest).items():
        rows.append(f"| {source} | {rate:,.0f} | {low / rate:.1f}-{high / rate:.1f} |")
    return "\n".join(rows) + "\n"


# Name -> what the block renders to, from LATEST.json's document.
BLOCKS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "latest": latest_markdown,
    "targets": targets_table,
    "sizes": sizes_table,
    "pipeline-wall": pipeline_wall,
    "beam-scaling": beam_scaling,
    "reader-per-core": reader_per_core,
    "input-cores-per-gpu": input_cores_per_gpu,
    "wide-and-deep-a100": wide_and_deep_a100,
    "loop-vs-fit": loop_vs_fit,
}


def render_page(page: str, latest: Mapping[str, Any]) -> str:
    """``page`` with every generated block rewritten from ``latest``. An unknown block name is
    refused, naming it and the known ones."""

    def block(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in BLOCKS:
            raise ValueError(
                f"unknown generated block `bench:{name}`; the known ones: {', '.join(BLOCKS)}"
            )
        text = BLOCKS[name](latest)
        body = f"\n\n{text.strip(chr(10))}\n\n" if "\n" in text.strip("\n") else text
        return f"<!-- bench:{name} -->{body}<!-- /bench:{name} -->"

    return _BLOCK.sub(block, page)


def blocks_in(page: str) -> list[str]:
    """The names of the generated blocks in ``page``, in order."""
    return [m.group(1) for m in _BLOCK.finditer(page)]


def outside_blocks(page: str) -> str:
    """``page`` without its generated blocks' text (the markers stay)."""
    return _BLOCK.sub(lambda m: f"<!-- bench:{m.group(1)} --><!-- /bench:{m.group(1)} -->", page)


def update_pages(latest_path: Path = LATEST_JSON, pages: tuple[Path, ...] = PAGES) -> list[Path]:
    """Renders ``LATEST.md`` beside ``latest_path``, the generated blocks of ``pages`` and (for
    the repo's own pages) the advisor's figures file from it again (after a change of a
    renderer); the files it changed."""
    latest = json.loads(latest_path.read_text(encoding="utf-8"))
    changed = []
    markdown = latest_path.with_suffix(".md")
    if not markdown.exists() or markdown.read_text(encoding="utf-8") != latest_markdown(latest):
        replace_file(markdown, latest_markdown(latest))
        changed.append(markdown)
    # The advisor's figures: package data of the training library, from the same document.
    if pages == PAGES and update_figures(latest):
        changed.append(FIGURES_FILE)
    for path in pages:
        page = path.read_text(encoding="utf-8")
        new = render_page(page, latest)
        if new != page:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed
