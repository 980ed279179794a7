"""`fullthrottle gpu-check` (`make gpu-check`): on a machine without a GPU it refuses with the
reason; with `--allow-cpu` the same check runs end to end on the CPU (two logical devices for
the MirroredStrategy run), so everything but the GPU itself is exercised here."""

from __future__ import annotations

import json
import math

import pytest
import tensorflow as tf

from fullthrottle import cli
from tests.helpers import run_cli

GPUS = tf.config.list_physical_devices("GPU")


@pytest.mark.skipif(bool(GPUS), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_and_exits_non_zero():
    result = run_cli("gpu-check", timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert (
        "fullthrottle gpu-check: error: TensorFlow sees no GPU, so there is nothing to check"
        in (result.stderr)
    )
    assert "libcuda.so.1" in result.stderr  # the reason on these machines: no NVIDIA driver
    assert "nvidia-smi" in result.stderr and "--allow-cpu" in result.stderr  # what to do
    assert "Traceback" not in result.stderr and not result.stdout


def test_bad_sizes_are_refused_naming_the_flag(capsys):
    assert cli.main(["gpu-check", "--allow-cpu", "--steps", "1"]) == 2
    assert "`--steps` must be >= 2, got 1" in capsys.readouterr().err


@pytest.mark.slow
def test_allow_cpu_runs_both_trainings_and_reports_every_figure(tmp_path, capsys):
    # In this process TensorFlow already has two logical CPUs (conftest): the mirrored run uses them.
    output = tmp_path / "gpu-check.json"
    argv = ["gpu-check", "--allow-cpu", "--steps", "8", "--per-replica-batch-size", "4"]
    argv += ["--sequence-length", "16", "--json", str(output)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    results = json.loads(output.read_text())
    # On a GPU machine the same test runs on its GPUs (--allow-cpu only permits the CPU).
    replicas = len(GPUS) or 2
    assert results["device"] == ("gpu" if GPUS else "cpu") and len(results["gpus"]) == len(GPUS)
    assert results["cuda_build"].startswith("12.")
    ceiling = results["matmul_ceiling"]
    assert ceiling["dtype"] == "float16" and ceiling["flops_per_second"] > 0
    single, mirrored = results["runs"]
    assert (single["strategy"], single["replicas"]) == ("OneDeviceStrategy", 1)
    assert (mirrored["strategy"], mirrored["replicas"]) == ("MirroredStrategy", replicas)
    for run in (single, mirrored):
        assert run["steps"] == 8
        assert run["precision"] == "mixed_float16"
        assert run["examples_per_second"] > 0
        assert 0 < run["mfu"] < 1
        assert 0 <= run["input_wait_fraction"] <= 1
        assert run["loss_scale_skipped_steps"] >= 0
        assert math.isfinite(run["final_loss"])
    assert mirrored["global_batch_size"] == replicas * single["global_batch_size"] == replicas * 4
    # The report shows the same figures, and whether they are a GPU's.
    if not GPUS:
        assert "--allow-cpu: these numbers say nothing about a GPU" in printed
    assert "loss-scale skips" in printed and "MFU" in printed and "input wait" in printed
    assert f"{mirrored['examples_per_second']:.1f}" in printed
    if replicas > 1:
        assert f"scaling over {replicas} replicas" in printed
