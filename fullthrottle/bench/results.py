"""Results files: one run's ``<timestamp>.json`` and ``.md``, and the newest reading of each
benchmark across runs in ``LATEST.json`` (``LATEST.md`` is rendered from it). The tables are
rendered by each benchmark's own ``rows`` (``benchmarks.BENCHMARKS``), ratios first (absolutes
are noisy), each target's verdict beside its ratio."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fullthrottle.bench.benchmarks import BENCHMARKS
from fullthrottle.bench.verdicts import judge, verdict_text

LATEST = "LATEST"
TABLE_HEADER = (
    "| benchmark | contenders (median examples/s, ±half spread) | ratio of medians (paired "
    "median) [paired min-max] | target (judged on the lower ratio) |\n|---|---|---|---|"
)


def machine_text(m: Mapping[str, Any]) -> str:
    """The machine a reading was taken on, as the tables name it."""
    return (
        f"{m['cpu']}, {m['cpu_count']} cores, bf16 {m['cpu_bf16']}, GPUs {m['gpus'] or 'none'}, "
        f"TensorFlow {m['tensorflow']}"
    )


def results_table(results: Mapping[str, Any], verdicts: list[dict[str, Any]]) -> str:
    """Results as a Markdown table: each benchmark's rows in the registry's order; a benchmark
    that failed or was skipped gets one row saying so."""
    target_of = {t["name"]: t for t in verdicts}

    def verdict(name: str) -> str:
        return verdict_text(target_of.get(name))

    rows = [TABLE_HEADER]
    names = [n for n in BENCHMARKS if n in results] + [n for n in results if n not in BENCHMARKS]
    for name in names:
        part = results[name]
        if not isinstance(part, Mapping):
            continue
        if "error" in part:
            rows.append(f"| {name}: FAILED | {part['error'][:200]} | | |")
        elif "skipped" in part:
            rows.append(f"| {name}: skipped | {part['skipped']} | | |")
        elif name in BENCHMARKS:
            rows += BENCHMARKS[name].rows(part, verdict)
    return "\n".join(rows) + "\n"


def markdown_table(document: Mapping[str, Any]) -> str:
    """One run's results as Markdown: the run and its machine, then :func:`results_table`."""
    header = (
        f"results of `fullthrottle bench` ({document['mode']}), {document['date']}, "
        f"commit {document['git_commit']}\n"
        f"machine: {machine_text(document['machine'])}; suite {document['suite_seconds']:.0f} s\n"
    )
    return header + "\n" + results_table(document["results"], document["targets"])


def write_results(document: Mapping[str, Any], results_dir: Path) -> tuple[Path, Path]:
    """``<results_dir>/<timestamp>.json`` and ``.md`` (never overwriting an existing result),
    then ``LATEST.json`` and ``LATEST.md`` updated with this run's readings (:func:`update_latest`).
    Returns the run's two files."""
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = document["date"].replace(":", "").replace("+0000", "Z")
    stem = stamp
    n = 1
    while (results_dir / f"{stem}.json").exists():
        n += 1
        stem = f"{stamp}-{n}"
    json_path, md_path = results_dir / f"{stem}.json", results_dir / f"{stem}.md"
    json_path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    md_path.write_text(markdown_table(document), encoding="utf-8")
    update_latest(results_dir, document, results_file=stem)
    return json_path, md_path


def merge_latest(
    latest: Mapping[str, Any] | None, document: Mapping[str, Any], *, results_file: str
) -> dict[str, Any]:
    """``latest`` (a ``LATEST.json`` document, or None) with the readings of one run's
    ``document`` (written as ``<results_file>.json``) in place of the earlier ones.

    A benchmark the run did not select keeps its earlier reading; one it skipped (quick mode's
    Beam scaling and checkpoint lever) is no reading and keeps it too; one that failed is the
    newest reading of that benchmark, and replaces it. A quick run's reading never replaces a
    full run's (quick windows are a smoke test, not a measurement to publish). Each benchmark's
    ``provenance`` names the run it came from; the targets are judged again over the merged
    results.
    """
    results = dict(latest["results"]) if latest else {}
    provenance = dict(latest["provenance"]) if latest else {}
    for name, part in document["results"].items():
        if isinstance(part, Mapping) and "skipped" in part:
            continue
        if document["mode"] == "quick" and provenance.get(name, {}).get("mode") == "full":
            continue
        results[name] = part
        provenance[name] = {
            "results_file": results_file,
            "date": document["date"],
            "mode": document["mode"],
            "command": document["command"],
            "git_commit": document["git_commit"],
            "machine": document["machine"],
        }
    order = [name for name in BENCHMARKS if name in results]
    order += sorted(set(results) - set(order))
    merged = {name: results[name] for name in order}
    return {
        "results": merged,
        "provenance": {name: provenance[name] for name in order},
        "targets": judge(merged),
    }


def latest_markdown(latest: Mapping[str, Any]) -> str:
    """``LATEST.md``: which run each benchmark's reading comes from, then :func:`results_table`."""
    rows = [
        "latest reading of each benchmark of `fullthrottle bench` (bench/results/LATEST.json)",
        "",
        "| benchmark | results file | mode | commit | finished (UTC) | seconds | machine |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, source in latest["provenance"].items():
        seconds = latest["results"][name].get("bench_seconds")
        rows.append(
            f"| {name} | {source['results_file']} | {source['mode']} | {source['git_commit']} | "
            f"{source['date']} | {'' if seconds is None else f'{seconds:.0f}'} | "
            f"{machine_text(source['machine'])} |"
        )
    return "\n".join(rows) + "\n\n" + results_table(latest["results"], latest["targets"])


def update_latest(
    results_dir: Path, document: Mapping[str, Any], *, results_file: str
) -> tuple[Path, Path]:
    """Merges ``document`` into ``<results_dir>/LATEST.json`` (:func:`merge_latest`) and renders
    ``LATEST.md`` from the file as written. Returns both paths."""
    json_path, md_path = results_dir / f"{LATEST}.json", results_dir / f"{LATEST}.md"
    earlier = json.loads(json_path.read_text(encoding="utf-8")) if json_path.exists() else None
    latest = merge_latest(earlier, document, results_file=results_file)
    replace_file(json_path, json.dumps(latest, indent=2, default=str) + "\n")
    # Rendered from the JSON as read back, so LATEST.md is exactly what its JSON renders to.
    replace_file(md_path, latest_markdown(json.loads(json_path.read_text(encoding="utf-8"))))
    return json_path, md_path


def replace_file(path: Path, text: str) -> None:
    """Writes ``path`` whole or not at all (a ``.tmp`` sibling renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
