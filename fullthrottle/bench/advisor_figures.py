"""The figures the step-time advisor quotes, written from ``bench/results/LATEST.json`` into the
training library as package data (``trainer_module/training/bench_figures.json``).

The advisor runs inside the Trainer, from an installed package, where ``bench/results`` is not:
so ``fullthrottle bench`` (and ``fullthrottle bench --docs``) writes the few measured figures it
needs beside it, with the run they come from, and ``tests/test_advisor.py`` fails when the
shipped file differs from what ``LATEST.json`` renders to. Only measurements are copied; what
they mean for a run (faster or not, break-even epochs) the advisor computes. A figure
``LATEST.json`` lacks is left out, and the advisor then says nothing about its lever.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fullthrottle.bench.benchmarks.base import REPO, entry_at
from fullthrottle.bench.model_process import STREAMING_BATCH_SIZES

FIGURES_FILE = REPO / "trainer_module" / "training" / "bench_figures.json"
MODELS = ("transformer", "tabular")
# A model's lever rows in the trainer benchmark: (result key, the config field it measures on
# vs off, the value it advises).
LEVER_ROWS = (
    ("fused_vs_unfused", "models.transformer.fused_kernels", True),
    ("trimmed_vs_untrimmed", "models.transformer.trim_padding", True),
)


def _ratio(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A ratio entry as the targets judge it: the lower of the ratio of medians and the paired
    median, with the paired median's interval."""
    out: dict[str, Any] = {"ratio": min(entry["ratio"], entry.get("paired_median", entry["ratio"]))}
    if entry.get("paired_interval"):
        out["interval"] = dict(entry["paired_interval"])
    return out


def _input_cached(model: str, entry: Mapping[str, Any]) -> bool:
    """Whether a model's input-efficiency row read cached input. Results before the row
    recorded it: the bench's configs (the Transformer streams with `cache: false`; the tabular
    model's `cache: auto` caches the bench's small tabular split, as its target says)."""
    if "input_cached" in entry:
        return bool(entry["input_cached"])
    from fullthrottle.bench.workloads import TABULAR_TRAINING, TRANSFORMER_TRAINING

    config = {"transformer": TRANSFORMER_TRAINING, "tabular": TABULAR_TRAINING}[model]
    return config.cache is not False


def advisor_figures(latest: Mapping[str, Any]) -> dict[str, Any]:
    """The advisor's figures from a ``LATEST.json`` document (the trainer benchmark's reading)."""
    trainer = entry_at(latest.get("results"), "trainer")
    source = entry_at(latest.get("provenance"), "trainer") or {}
    machine = source.get("machine") or {}
    figures: dict[str, Any] = {
        "about": "generated from bench/results/LATEST.json by `fullthrottle bench` "
        "(fullthrottle/bench/advisor_figures.py): edit nothing here",
        "source": {k: source.get(k) for k in ("results_file", "mode", "git_commit", "date")},
        "device": {
            "kind": "gpu" if machine.get("gpus") else "cpu",
            "cpu": machine.get("cpu"),
            "cpu_bf16": machine.get("cpu_bf16"),
        },
        "levers": [],
        "cached_vs_in_memory": [],
        "copies": [],
    }
    if not isinstance(trainer, Mapping):
        return figures
    for model in MODELS:
        m = trainer.get(model)
        if not isinstance(m, Mapping) or "precision_policy" not in m:
            continue
        who = {"model": model, "precision": m["precision_policy"]}
        for key, field, value in LEVER_ROWS:
            if isinstance(m.get(key), Mapping):
                figures["levers"].append({**who, "field": field, "value": value, **_ratio(m[key])})
        efficiency = m.get("input_efficiency")
        if isinstance(efficiency, Mapping) and _input_cached(model, efficiency):
            figures["cached_vs_in_memory"].append({**who, **_ratio(efficiency)})
        ceilings = m.get("matmul_ceiling") or {}
        if "bf16_vs_float32_matmuls" not in figures and {"bfloat16", "float32"} <= set(ceilings):
            bf16 = ceilings["bfloat16"]["flops_per_second"]
            f32 = ceilings["float32"]["flops_per_second"]
            figures["bf16_vs_float32_matmuls"] = {
                "ratio": bf16 / f32,
                "bfloat16_gflops": bf16 / 1e9,
                "float32_gflops": f32 / 1e9,
            }
        streaming = m.get("streaming")
        if not isinstance(streaming, Mapping):
            continue
        per_core = {
            source: entry_at(streaming, key, "per_cpu_second", "median")
            for source, key in (("records", "reader"), ("prebatched", "reader_prebatched"))
        }
        if all(per_core.values()):
            figures["reader_per_core"] = {**who, **per_core}
        write = entry_at(streaming, "reader_prebatched", "write_seconds")
        for batch in STREAMING_BATCH_SIZES:
            plain = entry_at(streaming, f"b{batch}", "streaming", "median")
            copies = entry_at(streaming, f"b{batch}_prebatched", "prebatched", "median")
            if write is None or plain is None or copies is None:
                continue
            figures["copies"].append(
                {
                    **who,
                    "global_batch_size": batch,
                    "rows": streaming["rows"],
                    "write_seconds": write,
                    "streaming_examples_per_second": plain,
                    "copies_examples_per_second": copies,
                }
            )
    return figures


def figures_text(latest: Mapping[str, Any]) -> str:
    """The figures file's text for ``latest``."""
    return json.dumps(advisor_figures(latest), indent=2, sort_keys=True) + "\n"


def update_figures(latest: Mapping[str, Any], path: Path = FIGURES_FILE) -> bool:
    """Writes the figures file from ``latest``; whether it changed."""
    text = figures_text(latest)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.write_text(text, encoding="utf-8")
    return True
