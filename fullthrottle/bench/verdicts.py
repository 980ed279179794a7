"""Each target judged on its reading: met or not, and decided or undecided.

A verdict is **decided** only when the 90% interval of the median it comes from lies wholly on
its side of the line (``measure.median_interval``); a target measured in several processes is
decided only if every process's own paired median falls on that side too. A verdict on a
median whose interval straddles the line could flip in the next run of the same code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fullthrottle.bench.benchmarks import BENCHMARKS
from fullthrottle.bench.measure import INTERVAL_CONFIDENCE


def judge(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every registered target's verdict on ``results`` (a document's ``results``: benchmark
    name -> its result), in the registry's order. A target whose benchmark did not run, or
    whose reading is missing, has ``met`` None."""
    out = []
    for spec in BENCHMARKS.values():
        result = results.get(spec.name)
        for target in spec.targets:
            reading = target.read(result) if isinstance(result, Mapping) else None
            out.append(_verdict(target.name, target.line, reading))
    return out


def _verdict(name: str, line: float, reading: Any) -> dict[str, Any]:
    measured = None if reading is None else reading.value
    met = None if measured is None else measured >= line
    entry: dict[str, Any] = {"name": name, "target": line, "measured": measured, "met": met}
    interval = None if reading is None else reading.interval
    if interval is not None and met is not None:
        # From fewer pairs than a 90% interval needs (n < 5: quick mode's 3) it is undecided.
        entry["paired_interval"] = dict(interval)
        entry["decided"] = interval["coverage"] >= INTERVAL_CONFIDENCE and (
            interval["low"] >= line if met else interval["high"] < line
        )
        # Measured in several processes: the interval covers the noise between windows, not
        # between runs, so each process's own paired median must fall on the verdict's side.
        if len(reading.run_medians) > 1:
            entry["run_paired_medians"] = list(reading.run_medians)
            entry["runs_agree"] = all((m >= line) == met for m in reading.run_medians)
            entry["decided"] = entry["decided"] and entry["runs_agree"]
    return entry


def verdict_text(t: Mapping[str, Any] | None) -> str:
    """A target's verdict for the table: met or not, and why it is undecided if it is."""
    if not t or t["met"] is None:
        return ""
    text = f">= {t['target']:g}: {'met' if t['met'] else 'NOT met'}"
    interval = t.get("paired_interval")
    if interval is None or t["decided"]:
        return text
    runs = ""
    if t.get("runs_agree") is False:
        medians = ", ".join(f"{m:.3f}" for m in t["run_paired_medians"])
        runs = (
            f"its {len(t['run_paired_medians'])} processes' paired medians ({medians}) "
            "fall on both sides of the line"
        )
    if interval["coverage"] < INTERVAL_CONFIDENCE:
        why = f"too few pairs for a {INTERVAL_CONFIDENCE:.0%} interval of the paired median"
    elif interval["low"] >= t["target"] if t["met"] else interval["high"] < t["target"]:
        # The interval is on the verdict's side of the line: only the processes disagree.
        return f"{text} (undecided: {runs}: the runs differ by more than one run's noise)"
    else:
        if t["target"] < 100:
            what, low, high = (
                "the paired median's",
                f"{interval['low']:.3f}",
                f"{interval['high']:.3f}",
            )
        else:
            what, low, high = "the median's", f"{interval['low']:,.0f}", f"{interval['high']:,.0f}"
        why = f"{what} {interval['coverage']:.0%} interval {low}-{high} contains the line"
        why += f"; {runs}" if runs else ""
    return f"{text} (undecided: {why}; more repetitions would decide)"
