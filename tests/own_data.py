"""A new user's own data: a CSV the project has never seen, then `init` and `run` once per session.

Shared by tests/test_init.py (the model it pushes) and tests/test_progress.py (what `run` showed
while it ran): the pipeline runs once per pytest process however many tests read it.
"""

from __future__ import annotations

import csv
import functools
import random
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess

from tests.helpers import run_cli

LABEL = "plan"
PLANS = {"basic": 20.0, "pro": 80.0, "enterprise": 300.0}
# Words that give the plan away in the free-text column, plus filler shared by every plan.
PLAN_WORDS = {
    "basic": ["cheap", "simple", "starter", "small"],
    "pro": ["fast", "reliable", "support", "growing"],
    "enterprise": ["scale", "security", "contract", "compliance"],
}
FILLER = ["the", "service", "was", "and", "our", "team", "really", "needs", "more", "with", "good"]
TRAIN_STEPS = 200


def write_customers_csv(path: Path, *, rows: int = 600, seed: int = 11) -> list[dict[str, str]]:
    """Numeric (with missing cells, some written "NA"), categorical (with missing), free text,
    an identifier and a constant column; the label is learnable from spend and the text."""
    rng = random.Random(seed)
    records = []
    for i in range(rows):
        plan = rng.choice(sorted(PLANS))
        base = PLANS[plan]
        words = rng.sample(FILLER, 4) + [rng.choice(PLAN_WORDS[plan])] + rng.sample(FILLER, 3)
        rng.shuffle(words)
        records.append(
            {
                "customer_id": f"c{i:05d}",
                "monthly_spend": ""
                if rng.random() < 0.08
                else f"{base * rng.uniform(0.7, 1.3):.2f}",
                "seats": "NA"
                if rng.random() < 0.05
                else str(max(1, int(base / 10 * rng.uniform(0.5, 1.5)))),
                "region": "" if rng.random() < 0.05 else rng.choice(["emea", "amer", "apac"]),
                "feedback": " ".join(words),
                "source": "web",  # a single value: init drops it
                LABEL: plan,
            }
        )
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    return records


@dataclass(frozen=True)
class OwnDataRun:
    workdir: Path
    csv_path: Path
    config_path: Path
    output_dir: Path
    records: list[dict[str, str]]
    init: CompletedProcess
    run: CompletedProcess


@functools.cache
def own_data_run(base: str) -> OwnDataRun:
    """Acts as a new user: writes the CSV, `fullthrottle init`, then `fullthrottle run`."""
    workdir = Path(base) / "own_data"
    workdir.mkdir(parents=True, exist_ok=True)
    csv_path = workdir / "customers.csv"
    records = write_customers_csv(csv_path)
    config_path = workdir / "customers.yaml"
    init = run_cli(
        "init", "--data", str(csv_path), "--label", LABEL, "--output", str(config_path), cwd=workdir
    )
    assert init.returncode == 0, f"init failed:\n{init.stdout}\n{init.stderr[-3000:]}"
    output_dir = workdir / "runs"
    run = run_cli(
        "run",
        "--config",
        str(config_path),
        "--output-dir",
        str(output_dir),
        "--set",
        f"training.train_steps={TRAIN_STEPS}",
        # Several loops, so the trainer's progress shows more than one line.
        "--set",
        "training.steps_per_loop=50",
        cwd=workdir,
    )
    return OwnDataRun(workdir, csv_path, config_path, output_dir, records, init, run)
