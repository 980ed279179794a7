"""The Dockerfile cannot be built here (no Docker engine); these checks keep it consistent with
the locks and with what the compiled spec and the TFJob replicas call: two targets from the
runtime lock, `gpu` (the default, with the CUDA wheels) and `cpu` (without), both non-root and
compiler-free, neither with the development tools."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from components.tfjob_trainer import WORKER_COMMAND
from pipelines.kubeflow_v2_runner import ENTRYPOINT

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = (REPO / "Dockerfile").read_text()


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in DOCKERFILE.splitlines() if not line.lstrip().startswith("#")),
    )
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in text.splitlines()
        if line.strip()
    ]


def _stages() -> dict[str, dict]:
    """Each build stage: its base (`FROM x AS name`) and its instructions, in order."""
    args = {
        name.split("=", 1)[0]: name.split("=", 1)[1]
        for kind, name in _instructions()
        if kind == "ARG" and "=" in name
    }
    stages: dict[str, dict] = {}
    current = None
    for kind, arguments in _instructions():
        if kind == "FROM":
            base, _, name = re.split(r"\s+", arguments.strip(), maxsplit=2)
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
            current = stages[name] = {"base": base, "body": []}
        elif current is not None:
            current["body"].append((kind, arguments))
    return stages


STAGES = _stages()
FINAL = ("cpu", "gpu")


def _lineage(stage: str) -> list[str]:
    """The stage and the stages it is built FROM, nearest first."""
    chain = [stage]
    while STAGES[chain[-1]]["base"] in STAGES:
        chain.append(STAGES[chain[-1]]["base"])
    return chain


def _body(stage: str, kind: str) -> list[str]:
    return [a for s in _lineage(stage) for k, a in STAGES[s]["body"] if k == kind]


def _commands(stage: str) -> list[str]:
    return [c.strip() for run in _body(stage, "RUN") for c in re.split(r"&&|;", run)]


RUNTIME_LOCK = "requirements-runtime.lock"


def _lock_pins(name: str = RUNTIME_LOCK) -> dict[str, str]:
    lock = (REPO / name).read_text()
    return {
        canonicalize_name(package): version
        for package, version in re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+) \\$", lock, re.M)
    }


def test_base_is_python_313_on_a_glibc_that_loads_the_locked_wheels():
    bases = {s["base"] for s in STAGES.values() if s["base"] not in STAGES}
    # ml-metadata and TFDV 1.21 ship manylinux_2_39 wheels only: Debian 13 (trixie) has glibc 2.41.
    assert len(bases) == 1, bases
    assert re.fullmatch(r"python:3\.13(\.\d+)?-(slim-)?trixie", bases.pop())


def test_two_final_images_gpu_by_default_both_non_root_and_without_a_compiler():
    names = list(STAGES)
    assert names[-1] == "gpu", "`docker build .` must build the GPU-capable image"
    for stage in FINAL:
        # Built FROM the bare base, not from the build stage: the compiler stays behind.
        assert "venv" not in _lineage(stage), _lineage(stage)
        installs = [c for c in _commands(stage) if "apt-get install" in c]
        assert not installs, f"{stage} installs system packages: {installs}"
        users = _body(stage, "USER")
        assert users and users[-1].strip() not in ("root", "0"), f"{stage} runs as {users}"
        assert any("useradd" in c and users[-1].strip() in c for c in _commands(stage))
    assert any("g++" in c for c in _commands("venv")), "the build stage compiles pyfarmhash"


def test_installs_exactly_the_lock_and_the_project_without_resolving():
    pip_installs = {
        stage: [c for c in _commands(stage) if re.search(r"\bpip install\b", c)] for stage in STAGES
    }
    # The build stage installs the runtime lock, and only that lock.
    (lock_install,) = pip_installs["venv"]
    assert "--require-hashes" in lock_install and "--no-deps" in lock_install
    assert re.search(r"-r /opt/requirements\.lock\b", lock_install)
    assert any(
        args.split() == [RUNTIME_LOCK, "/opt/requirements.lock"] for args in _body("venv", "COPY")
    )
    # Each final image adds the project, and nothing else, on top of that venv.
    for stage in FINAL:
        own = [c for c in pip_installs[stage] if c not in pip_installs["venv"]]
        (project_install,) = own
        assert "--no-deps" in project_install and "--no-build-isolation" in project_install
    # Both locks are complete and hashed: every pinned package carries a hash.
    for name in ("requirements.lock", RUNTIME_LOCK):
        lock = (REPO / name).read_text()
        pins = re.findall(r"^([A-Za-z0-9_.\-\[\]]+)==\S+ \\\n\s+--hash=sha256:", lock, re.M)
        assert len(pins) == len(re.findall(r"^[A-Za-z0-9_.\-\[\]]+==", lock, re.M)) > 100, name
    # No build isolation in the image: setuptools must come from the runtime lock.
    assert "setuptools" in _lock_pins()


def test_the_runtime_lock_is_the_runtime_set_at_the_development_lock_s_versions():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    runtime, full = _lock_pins(), _lock_pins("requirements.lock")
    # The same version of everything the images and the development environment share.
    assert {name: full.get(name) for name in runtime} == runtime
    # Every runtime dependency (and the `gpu` extra) is in it; no development tool is.
    declared = [
        *project["project"]["dependencies"],
        *project["project"]["optional-dependencies"]["gpu"],
    ]
    assert {canonicalize_name(Requirement(r).name) for r in declared} <= set(runtime)
    dev_tools = {
        canonicalize_name(Requirement(r).name) for r in project["dependency-groups"]["dev"]
    }
    assert dev_tools <= set(full), "the development lock holds the dev group"
    assert not dev_tools & set(runtime), dev_tools & set(runtime)


def test_the_gpu_image_has_the_cuda_wheels_and_the_cpu_image_drops_exactly_those():
    copies = {stage: _body(stage, "COPY") for stage in FINAL}
    assert any(c.startswith("--from=venv /opt/venv") for c in copies["gpu"]), copies["gpu"]
    assert any(c.startswith("--from=venv-cpu /opt/venv") for c in copies["cpu"]), copies["cpu"]
    assert STAGES["venv-cpu"]["base"] == "venv"
    (uninstall,) = [c for c in _commands("venv-cpu") if "pip uninstall" in c]
    # Run the stage's own selection of packages against the lock, as the build would.
    selection = (
        re.search(r"\$\((.*)\)", uninstall)
        .group(1)
        .replace("/opt/requirements.lock", str(REPO / RUNTIME_LOCK))
    )
    dropped = set(
        subprocess.run(
            ["bash", "-c", selection], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    pins = _lock_pins()
    cuda_wheels = {name for name in pins if name.startswith("nvidia-") and name.endswith("-cu12")}
    assert dropped == cuda_wheels and len(cuda_wheels) >= 10, dropped ^ cuda_wheels
    # What the GPU image keeps: TensorFlow's CUDA 12 libraries and NVML for GPU metrics.
    assert {"nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-nccl-cu12"} <= cuda_wheels
    assert "nvidia-ml-py" in pins and "nvidia-ml-py" not in dropped
    assert "pip check" in " ".join(_commands("venv-cpu"))


def test_the_gpu_image_asks_for_the_node_s_driver():
    env = " ".join(_body("gpu", "ENV"))
    assert "NVIDIA_VISIBLE_DEVICES=all" in env
    assert re.search(r"NVIDIA_DRIVER_CAPABILITIES=\S*compute", env)
    assert re.search(r"NVIDIA_DRIVER_CAPABILITIES=\S*utility", env)  # nvidia-smi, NVML
    assert "LD_LIBRARY_PATH=/usr/local/nvidia/lib64" in env
    assert "NVIDIA_" not in " ".join(_body("cpu", "ENV"))


def test_entrypoint_is_the_command_of_the_compiled_spec():
    for stage in FINAL:
        entrypoint = _body(stage, "ENTRYPOINT")[0]
        assert tuple(json.loads(entrypoint)) == ENTRYPOINT, stage
    # TFJob replicas override it with TFX's run_executor, through the same interpreter.
    assert WORKER_COMMAND[:2] == ENTRYPOINT[:2]


def test_the_packages_the_spec_names_are_in_the_image():
    for stage in FINAL:
        copies = [args.split() for args in _body(stage, "COPY")]
        assert any(src == "." for *sources, _ in copies for src in sources), f"{stage}: no repo"
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # The dotted names the spec carries: run_fn, preprocessing_fn, executors, and the packages
    # they import at run time.
    for package in ("trainer_module", "serving", "pipelines", "components", "fullthrottle"):
        for path in (REPO / package).rglob("*.py"):
            relative = path.relative_to(REPO).as_posix()
            hits = [
                p
                for p in ignored
                if fnmatch.fnmatch(relative, p.lstrip("/"))
                or relative.startswith(p.rstrip("/") + "/")
            ]
            assert not hits, f"{relative} is excluded from the image by .dockerignore {hits}"
