"""The Dockerfile read as text, kept consistent with the locks and with what the compiled spec and
the TFJob replicas call: two targets, `cpu` from the runtime lock and `gpu` (the default) that
adds the gpu lock's CUDA wheels on top, both non-root and compiler-free, neither with the
development tools. The images are built and run for real by tests/host/check_image.sh, a CI step
of its own (it drives buildah on the host)."""

from __future__ import annotations

import fnmatch
import json
import re
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
GPU_LOCK = "requirements-gpu.lock"


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
    # ... and it is a build argument, so a locally made equivalent can stand in (bin/image).
    assert any(a.startswith("BASE_IMAGE=") for k, a in _instructions() if k == "ARG")
    assert all("${BASE_IMAGE}" in a for k, a in _instructions() if k == "FROM" and " AS " in a
               and a.split()[0] not in STAGES)  # fmt: skip


def test_two_final_images_gpu_by_default_both_non_root_and_without_a_compiler():
    names = list(STAGES)
    assert names[-1] == "gpu", "`docker build .` must build the GPU-capable image"
    for stage in FINAL:
        # Built FROM the bare base, not from the build stage: the compiler stays behind.
        assert "build" not in _lineage(stage), _lineage(stage)
        installs = [c for c in _commands(stage) if "apt-get install" in c]
        assert not installs, f"{stage} installs system packages: {installs}"
        users = _body(stage, "USER")
        # Numeric, so that Kubernetes' runAsNonRoot can verify it; created in the image.
        uid, _, gid = users[-1].strip().partition(":")
        assert uid.isdigit() and int(uid) != 0 and gid == uid, f"{stage} runs as {users}"
        assert any("useradd" in c and f"--uid {uid}" in c for c in _commands(stage))
    assert any("g++" in c for c in _commands("build")), "the build stage compiles pyfarmhash"


def _pip_installs(stage: str) -> list[str]:
    return [c for c in _commands(stage) if re.search(r"\bpip install\b", c)]


def test_installs_exactly_the_locks_and_the_project_without_resolving():
    # The build stage installs the runtime lock, and only that lock, from the wheel cache.
    (lock_install,) = _pip_installs("build")
    for flag in ("--require-hashes", "--no-deps", "--no-index"):
        assert flag in lock_install, flag
    assert re.search(rf"-r /opt/locks/{re.escape(RUNTIME_LOCK)}\b", lock_install)
    assert any(args.split() == [RUNTIME_LOCK, "/opt/locks/"] for args in _body("build", "COPY"))
    # The gpu image adds the gpu lock, and only that, on top of the same venv.
    (gpu_install,) = [c for c in _pip_installs("runtime-gpu") if c not in _pip_installs("runtime")]
    for flag in ("--require-hashes", "--no-deps", "--no-index"):
        assert flag in gpu_install, flag
    assert re.search(rf"-r /opt/locks/{re.escape(GPU_LOCK)}\b", gpu_install)
    assert not any(GPU_LOCK in c for c in _commands("cpu")), "the cpu image must not see CUDA"
    # Each final image adds the project, and nothing else.
    for stage in FINAL:
        parent = STAGES[stage]["base"]
        own = [c for c in _pip_installs(stage) if c not in _pip_installs(parent)]
        (project_install,) = own
        assert "--no-deps" in project_install and "--no-build-isolation" in project_install
    # Every lock is complete and hashed: every pinned package carries a hash.
    for name in ("requirements.lock", RUNTIME_LOCK, GPU_LOCK):
        lock = (REPO / name).read_text()
        pins = re.findall(r"^([A-Za-z0-9_.\-\[\]]+)==\S+ \\\n\s+--hash=sha256:", lock, re.M)
        assert len(pins) == len(re.findall(r"^[A-Za-z0-9_.\-\[\]]+==", lock, re.M)) > 10, name
    # No build isolation in the image: setuptools must come from the runtime lock.
    assert "setuptools" in _lock_pins()


def test_downloads_go_to_the_shared_wheel_cache_one_downloader_at_a_time():
    for stage in ("build", "runtime-gpu"):
        (download,) = [r for r in _body(stage, "RUN") if "pip download" in r]
        assert "--mount=type=cache,id=fullthrottle-wheels" in download, stage
        assert re.search(r"flock \S+/\.lock \S*pip download", download), stage
        assert "--require-hashes" in download and "--no-deps" in download, stage


def test_the_runtime_lock_is_the_runtime_set_at_the_development_lock_s_versions():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    runtime, full, gpu = _lock_pins(), _lock_pins("requirements.lock"), _lock_pins(GPU_LOCK)
    # The same version of everything the images and the development environment share.
    assert {name: full.get(name) for name in runtime} == runtime
    # Every runtime dependency is in it, the gpu extra in the gpu lock; no development tool is.
    declared = {canonicalize_name(Requirement(r).name) for r in project["project"]["dependencies"]}
    assert declared <= set(runtime)
    extra = [Requirement(r) for r in project["project"]["optional-dependencies"]["gpu"]]
    assert {canonicalize_name(r.name) for r in extra} - {"tensorflow"} <= set(gpu)
    dev_tools = {
        canonicalize_name(Requirement(r).name) for r in project["dependency-groups"]["dev"]
    }
    assert dev_tools <= set(full), "the development lock holds the dev group"
    assert not dev_tools & set(runtime), dev_tools & set(runtime)


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
