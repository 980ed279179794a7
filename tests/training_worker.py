"""A training run in its own process, for the multi-worker and SIGKILL tests.

    python -m tests.training_worker SPEC.json

SPEC: {"config": {...TrainingConfig fields...}, "model": "tabular"|"text", "data_dir": str,
"work_dir": str, "result": path for the JSON result, "export_dir": str | null,
"loop_sleep": seconds to sleep after each loop (makes a run slow enough to kill), and
"progress": path to which each checkpoint step is appended}. A run stopped by a signal
(TrainingInterrupted) writes {"pid", "interrupted": {"step", "checkpoint", "signum"}} instead. Runs in a fresh interpreter: no
conftest, so TensorFlow sees one CPU device, and TF_CONFIG comes from the environment.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time

import numpy as np

from tests.training_data import feature_spec, tabular_inputs, text_inputs
from trainer_module.training import TrainingConfig, TrainingHook, train
from trainer_module.training.errors import TrainingInterrupted


class _Progress(TrainingHook):
    def __init__(self, progress: str | None, loop_sleep: float):
        self.progress = progress
        self.loop_sleep = loop_sleep

    def on_loop_end(self, step, metrics):
        if self.loop_sleep:
            time.sleep(self.loop_sleep)

    def on_checkpoint(self, step, path):
        if self.progress:
            with open(self.progress, "a") as f:
                f.write(f"{step}\n")


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    cfg = dict(spec["config"])
    if cfg.get("profile_steps") is not None:
        cfg["profile_steps"] = tuple(cfg["profile_steps"])
    config = TrainingConfig(**cfg)
    inputs = text_inputs() if spec.get("model") == "text" else tabular_inputs()
    data = spec["data_dir"]
    try:
        result = train(
            config=config,
            model_inputs=inputs,
            feature_spec=feature_spec(inputs),
            train_files=sorted(glob.glob(os.path.join(data, "train", "*"))),
            eval_files=sorted(glob.glob(os.path.join(data, "eval", "*"))),
            work_dir=spec["work_dir"],
            hooks=[_Progress(spec.get("progress"), float(spec.get("loop_sleep", 0)))],
        )
    except TrainingInterrupted as stopped:
        interrupted = {"step": stopped.step, "checkpoint": stopped.checkpoint}
        with open(spec["result"], "w") as f:
            json.dump(
                {"pid": os.getpid(), "interrupted": {**interrupted, "signum": stopped.signum}}, f
            )
        return
    exported = None
    if result.serving_model is not None and spec.get("export_dir"):
        os.makedirs(spec["export_dir"], exist_ok=True)
        exported = os.path.join(spec["export_dir"], f"serving-{os.getpid()}.weights.npz")
        np.savez(exported, *result.serving_model.get_weights())
    weights_path = spec["result"] + ".weights.npz"
    np.savez(weights_path, *[np.asarray(w, np.float32) for w in result.model.get_weights()])
    out = {
        "pid": os.getpid(),
        "is_chief": result.is_chief,
        "steps_completed": result.steps_completed,
        "start_step": result.facts.start_step,
        "final_loss": result.final_loss,
        "eval_metrics": result.eval_metrics,
        "num_replicas": result.facts.num_replicas,
        "num_workers": result.facts.num_workers,
        "strategy_name": result.facts.strategy_name,
        "serving_model_is_none": result.serving_model is None,
        "exported": exported,
        "weights": weights_path,
        "checkpoint_dir": result.checkpoint_dir,
        "losses": [r["loss"] for r in result.history],
        "examples_per_second": result.examples_per_second,
        "input_wait_fraction": result.input_wait_fraction,
    }
    with open(spec["result"], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
