"""What a benchmark is to the registry (:class:`BenchmarkSpec`), and the parts they share.

A benchmark is a name, a ``run`` that measures and returns a JSON-able result, its table rows
(``rows``: the result as Markdown table rows, each target's verdict beside its ratio), its
sizes in full and quick mode (a frozen dataclass whose fields say what each size is, see
:func:`size`), and its targets (:class:`Target`: a line and how to read the measured value
from the result). The suite, the verdicts, the results table, ``LATEST.json`` and the docs'
generated blocks all look a benchmark up in ``benchmarks.BENCHMARKS``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullthrottle.bench.measure import describe, ratio

REPO = Path(__file__).resolve().parents[3]


def size(default: Any, what: str) -> Any:
    """A sizes dataclass field with its default and what it sizes (the docs' sizes table)."""
    if isinstance(default, (dict, list)):
        return dataclasses.field(
            default_factory=lambda: type(default)(default), metadata={"what": what}
        )
    return dataclasses.field(default=default, metadata={"what": what})


@dataclass(frozen=True)
class Reading:
    """What a target is judged on: the measured ``value``, the 90% interval of the median it
    comes from when there is one (``measure.median_interval``), and, for a ratio measured in
    several processes, each process's own paired median."""

    value: float
    interval: Mapping[str, float] | None = None
    run_medians: tuple[float, ...] = ()


def entry_at(result: Mapping[str, Any] | None, *path: str) -> Any:
    """``result[path[0]][path[1]]...``, or None where a key is missing."""
    node: Any = result
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def ratio_reading(*path: str) -> Callable[[Mapping[str, Any]], Reading | None]:
    """A target on a ratio entry (``measure.ratio``) at ``path`` in the benchmark's result:
    judged on the lower of the ratio of medians and the paired median (load that shifts between
    repetitions can lift the first), decided by the paired median's interval."""

    def read(result: Mapping[str, Any]) -> Reading | None:
        entry = entry_at(result, *path)
        if not isinstance(entry, Mapping) or entry.get("ratio") is None:
            return None
        runs = entry.get("runs") or []
        return Reading(
            value=min(entry["ratio"], entry.get("paired_median", entry["ratio"])),
            interval=entry.get("paired_interval"),
            run_medians=tuple(run["paired_median"] for run in runs) if len(runs) > 1 else (),
        )

    return read


def rate_reading(*path: str) -> Callable[[Mapping[str, Any]], Reading | None]:
    """A target on a rate (``describe`` plus its ``interval``) at ``path``: its windows'
    median, decided by the median's interval."""

    def read(result: Mapping[str, Any]) -> Reading | None:
        entry = entry_at(result, *path)
        if not isinstance(entry, Mapping) or entry.get("median") is None:
            return None
        return Reading(value=entry["median"], interval=entry.get("interval"))

    return read


@dataclass(frozen=True)
class Target:
    """A design constant of the suite: the reading ``read`` takes from its benchmark's result
    is met when it is >= ``line``. ``measured_as`` says what the reading is (the docs' targets
    table). ``name`` is unique across the suite (``LATEST.json`` keys verdicts by it)."""

    name: str
    line: float
    measured_as: str
    read: Callable[[Mapping[str, Any]], Reading | None]


@dataclass(frozen=True)
class Context:
    """What a benchmark's ``run`` gets besides its sizes: the suite's work folder, the results
    of the benchmarks that ran before it in this run, and a log for progress lines."""

    work: Path
    results: Mapping[str, Any]
    log: Callable[[str], None]

    @property
    def pipeline(self) -> Mapping[str, Any] | None:
        """The pipeline benchmark's result in this run, when it ran and did not fail."""
        part = self.results.get("pipeline")
        return part if isinstance(part, Mapping) and "error" not in part else None

    def tabular_mlmd(self) -> Path:
        """MLMD of the transformed penguins data: the pipeline benchmark's run, or (when that
        benchmark was not selected or failed) a run of the pipeline's prefix up to Transform
        in ``work/tabular``, made once and shared by the benchmarks that train on it."""
        from fullthrottle.bench.workloads import run_transform_prefix, transform_prefix_config
        from fullthrottle.core.config import BeamConfig, DataSpec

        pipeline = self.pipeline
        if pipeline and pipeline.get("output_dir"):
            return Path(pipeline["output_dir"]) / "metadata" / "fullthrottle-penguins.sqlite"
        cfg = transform_prefix_config(
            output_dir=str(self.work / "tabular"), spec=DataSpec(), beam=BeamConfig()
        )
        if not Path(cfg.mlmd_path).exists():
            run_transform_prefix(cfg)
        return Path(cfg.mlmd_path)

    def tabular_data(self) -> Any:
        """The transformed penguins data (:meth:`tabular_mlmd`) as the Trainer reads it
        (``workloads.TrainingData``)."""
        from fullthrottle.bench.workloads import training_data_from_run
        from fullthrottle.core.config import DataSpec

        return training_data_from_run(str(self.tabular_mlmd()), DataSpec(), name="tabular")


# A benchmark's rows get the verdict text of a target by its name ("" when not judged).
Verdict = Callable[[str], str]


@dataclass(frozen=True)
class BenchmarkSpec:
    """A benchmark as the registry knows it.

    name:    its name in ``--only`` and in the results (``results[name]``).
    summary: one line: what it measures (``fullthrottle bench --help``).
    run:     ``run(context, sizes)`` -> its JSON-able result; ``{"skipped": why}`` when the
             sizes leave nothing to measure.
    rows:    ``rows(result, verdict)`` -> its Markdown table rows (``| a | b | c | d |``).
    full, quick: its sizes in each mode (instances of one frozen dataclass, fields made with
             :func:`size`).
    targets: its targets, in the order the verdicts list them.
    """

    name: str
    summary: str
    run: Callable[[Context, Any], dict[str, Any]]
    rows: Callable[[Mapping[str, Any], Verdict], list[str]]
    full: Any
    quick: Any
    targets: tuple[Target, ...] = ()


# --- what the benchmarks' results and rows share ----------------------------------------------
def ratio_entry(
    samples: Mapping[str, list[float]], num: str, den: str, unit: str = "examples/s"
) -> dict[str, Any]:
    """Two contenders' samples described, and their ratio (``measure.ratio``)."""
    return {
        "unit": unit,
        num: describe(samples[num]),
        den: describe(samples[den]),
        **ratio(samples, num, den),
    }


def fmt_ratio(entry: Mapping[str, Any] | None) -> str:
    """A ratio entry as the table shows it: ratio of medians (paired median) [paired min-max]."""
    if not entry or "ratio" not in entry:
        return "n/a"
    paired = entry.get("paired_median")
    middle = f" (paired median {paired:.2f}x)" if paired is not None else ""
    return f"{entry['ratio']:.2f}x{middle} [{entry['paired_min']:.2f}-{entry['paired_max']:.2f}]"


def fmt_rate(entry: Mapping[str, Any] | None) -> str:
    """A described rate as the table shows it: median (± half the relative spread)."""
    if not entry:
        return "n/a"
    spread = entry.get("spread")
    return f"{entry['median']:,.0f}" + (f" (±{spread / 2:.0%})" if spread is not None else "")


def ratio_row(title: str, entry: Mapping[str, Any], verdict: str | None = None) -> str:
    """A table row of a ratio entry: its two contenders' rates, the ratio and, for a ratio a
    target rides on, the verdict (None: a lever's row, its last cell empty)."""
    num, den = entry["numerator"], entry["denominator"]
    last = "| |" if verdict is None else f"| {verdict} |"
    return (
        f"| {title} | {fmt_rate(entry[num])} vs {fmt_rate(entry[den])} | {fmt_ratio(entry)} {last}"
    )
