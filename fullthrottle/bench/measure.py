"""Alternating measurements: how every comparison in the suite is timed.

These machines are shared and noisy, so absolute rates drift by tens of percent between minutes.
A comparison is therefore measured in one process, contenders alternated window by window
(the order rotated each repetition, so neither always runs first), several repetitions; we
report each contender's median and spread and the ratio of medians, plus the spread of the
per-repetition ratios (each taken from two windows measured seconds apart).
"""

from __future__ import annotations

import math
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
    contenders: Mapping[str, Callable[[], float]],
    *,
    repeats: int,
    side_by_side: tuple[str, str] | None = None,
) -> dict[str, list[float]]:
    """Calls each contender (returns a rate) once per repetition, rotating the order.

    ``side_by_side`` (two contender names): the pair whose ratio matters most runs as one unit,
    its two windows back to back in every repetition (a paired ratio is only as good as its two
    windows are close in time), the units rotated as above. The pair's own order flips every
    full rotation, so over every 2 x units repetitions each of the two runs first, after the
    same neighbours, equally often: a window can be slowed by what ran before it, and plain
    rotation of 4 contenders put one of the pair right after the same neighbour (the tabular
    suite's matmul ceiling) in 3 of 4 repetitions and the other in 1.
    """
    names = list(contenders)
    units: list[tuple[str, ...]] = [(name,) for name in names]
    if side_by_side is not None:
        first, second = side_by_side
        if first == second or first not in contenders or second not in contenders:
            raise ValueError(f"side_by_side must name two contenders, got {side_by_side!r}")
        units = [u for u in units if u[0] not in side_by_side]
        units.insert(min(names.index(first), names.index(second)), (first, second))
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats):
        shift = rep % len(units)
        flip = (rep // len(units)) % 2 == 1
        for unit in units[shift:] + units[:shift]:
            for name in reversed(unit) if flip else unit:
                samples[name].append(float(contenders[name]()))
    return samples


# The confidence of the paired median's interval that each ratio carries (`ratio`): a target's
# verdict counts as decided only when this interval lies wholly on its side of the line.
INTERVAL_CONFIDENCE = 0.90


def median_interval(
    values: Sequence[float], confidence: float = INTERVAL_CONFIDENCE
) -> dict[str, float]:
    """A distribution-free confidence interval for the median of `values`.

    The order statistics x(k) and x(n+1-k) (sorted, 1-based), for the largest k with
    P(Binomial(n, 1/2) <= k-1) <= (1 - confidence) / 2: the interval covers the true median with
    probability 1 - 2 P(B <= k-1) (its `coverage`), whatever the distribution, as long as the
    values are independent. With too few values for `confidence` (n < 5 at 0.90) it is the whole
    range, with its lower coverage. For 13 values at 0.90: x(4)-x(10), coverage 0.908.
    """
    ordered = sorted(float(v) for v in values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median_interval needs at least one value")

    def below(j: int) -> float:  # P(B <= j)
        return sum(math.comb(n, i) for i in range(j + 1)) / 2.0**n

    k = 1
    while k < (n + 1) // 2 and below(k) <= (1.0 - confidence) / 2.0:
        k += 1
    return {"low": ordered[k - 1], "high": ordered[n - k], "coverage": 1.0 - 2.0 * below(k - 1)}


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
        # How precisely this run pins the paired median down (see median_interval): a target
        # whose line falls inside it is not decided by this run, whichever side the median is.
        "paired_interval": median_interval(paired),
    }
