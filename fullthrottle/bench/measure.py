"""Alternating measurements: how every comparison in the suite is timed.

These machines are shared and noisy, so absolute rates drift by tens of percent between minutes.
A comparison is therefore measured in one process, contenders alternated window by window
(the order rotated each repetition, so neither always runs first), several repetitions; we
report each contender's median and spread and the ratio of medians, plus the spread of the
per-repetition ratios (each taken from two windows measured seconds apart).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def describe(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and relative spread ((max - min) / median) of some rates."""
    values = [float(v) for v in values]
    median = statistics.median(values)
    return {
        "median": median,
        "min": min(values),
        "max": max(values),
        "spread": (max(values) - min(values)) / median if median else None,
        "n": len(values),
        "values": values,
    }


def alternate(
    contenders: Mapping[str, Callable[[], float]], *, repeats: int
) -> dict[str, list[float]]:
    """Calls each contender (returns a rate) once per repetition, rotating the order."""
    names = list(contenders)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            samples[name].append(float(contenders[name]()))
    return samples


def ratio(
    samples: Mapping[str, Sequence[float]], numerator: str, denominator: str
) -> dict[str, Any]:
    """numerator/denominator: ratio of the medians, and the per-repetition ratios' spread."""
    top, bottom = samples[numerator], samples[denominator]
    paired = [a / b for a, b in zip(top, bottom, strict=True) if b]
    return {
        "numerator": numerator,
        "denominator": denominator,
        "ratio": statistics.median(top) / statistics.median(bottom),
        # Robust to load that shifts between repetitions (both windows of a pair see the same
        # minute); the ratio of medians is not, when the contenders' medians come from
        # different repetitions. Targets are judged on the lower of the two.
        "paired_median": statistics.median(paired),
        "paired_min": min(paired),
        "paired_max": max(paired),
        "paired": paired,
    }
