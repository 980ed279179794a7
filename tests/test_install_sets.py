"""One resolution, two install sets: requirements.lock (and the images' requirements-runtime.lock)
without CUDA, requirements-gpu.lock with what the `gpu` extra adds. The CUDA wheels are installed
only where they can be used (bin/envrun: an NVIDIA driver, or FULLTHROTTLE_ENV_GPU=1; the
Dockerfile: the gpu target), and everything else is at the same versions either way."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
LOCKS = ("requirements.lock", "requirements-runtime.lock", "requirements-gpu.lock")


def _pins(name: str) -> dict[str, str]:
    text = (REPO / name).read_text()
    return {
        canonicalize_name(package): version
        for package, version in re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+) \\$", text, re.M)
    }


DEV, RUNTIME, GPU = (_pins(name) for name in LOCKS)


def test_the_gpu_set_is_only_what_the_gpu_extra_adds():
    assert GPU and not set(GPU) & set(DEV) and not set(GPU) & set(RUNTIME)
    # NVIDIA's CUDA 12 wheels and NVML: nothing else comes with the extra.
    assert all(name.startswith("nvidia-") for name in GPU), sorted(GPU)
    assert {"nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-nccl-cu12", "nvidia-ml-py"} <= set(
        GPU
    )
    # TensorFlow's own `and-cuda` extra (from the installed wheel's metadata) is satisfied by
    # the gpu set's pins: adding the set to either lock completes `tensorflow[and-cuda]`.
    cuda = [
        Requirement(r)
        for r in importlib.metadata.requires("tensorflow") or []
        if "extra" in r and Requirement(r).marker.evaluate({"extra": "and-cuda"})
    ]
    assert len(cuda) >= 10, cuda
    for requirement in cuda:
        name = canonicalize_name(requirement.name)
        assert name in GPU, f"{name} (tensorflow[and-cuda]) is missing from requirements-gpu.lock"
        assert requirement.specifier.contains(GPU[name], prereleases=True), (requirement, GPU[name])
    # One resolution: TensorFlow itself is pinned once, as the extra asks.
    assert DEV["tensorflow"] == RUNTIME["tensorflow"] == "2.21.0"


def test_the_environment_is_the_lock_at_its_versions_with_cuda_only_in_the_gpu_set():
    # The environment's own site-packages: once imported, setuptools puts its vendored copies
    # (packaging, zipp, importlib-metadata, ... with their dist-info) on sys.path after them.
    site = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    installed = {
        canonicalize_name(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions(path=sorted(site))
    }
    wrong = {
        name: (pin, installed.get(name)) for name, pin in DEV.items() if installed.get(name) != pin
    }
    assert not wrong, f"installed versions differ from requirements.lock: {wrong}"
    present = [name for name in GPU if name in installed]
    # All of the gpu set (an environment for a GPU) or none of it (a CPU-only one), never part.
    assert present in ([], list(GPU)), present
    for name in present:
        assert installed[name] == GPU[name], name


def test_lock_subtract_refuses_two_resolutions(tmp_path):
    full = tmp_path / "full.lock"
    base = tmp_path / "base.lock"
    full.write_text(
        "absl-py==1.4.0 \\\n    --hash=sha256:aa\nnvidia-x==1.0 \\\n    --hash=sha256:bb\n"
    )
    base.write_text("absl-py==1.4.0 \\\n    --hash=sha256:aa\n")
    done = subprocess.run(
        [sys.executable, str(REPO / "bin" / "lock-subtract"), str(full), str(base)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stdout.strip() == "nvidia-x==1.0 \\\n    --hash=sha256:bb"
    base.write_text("absl-py==2.0.0 \\\n    --hash=sha256:cc\n")
    done = subprocess.run(
        [sys.executable, str(REPO / "bin" / "lock-subtract"), str(full), str(base)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "absl-py" in done.stderr and "not one resolution" in done.stderr


@pytest.mark.parametrize("value", ["yes", "2"])
def test_envrun_refuses_an_unknown_gpu_choice(value):
    done = subprocess.run(
        [str(REPO / "bin" / "envrun"), "true"],
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "FULLTHROTTLE_ENV_GPU": value},
        capture_output=True,
        text=True,
    )
    assert (
        done.returncode == 2
        and f"FULLTHROTTLE_ENV_GPU must be 1, 0 or auto, got '{value}'" in done.stderr
    )
