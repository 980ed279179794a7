"""The Dockerfile cannot be built here (no Docker engine); these checks keep it consistent with
the lock and with what the compiled spec and the TFJob replicas call."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

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


def test_base_is_python_313_on_a_glibc_that_loads_the_locked_wheels():
    (base,) = [args for name, args in _instructions() if name == "FROM"]
    # ml-metadata and TFDV 1.21 ship manylinux_2_39 wheels only: Debian 13 (trixie) has glibc 2.41.
    assert re.fullmatch(r"python:3\.13(\.\d+)?-(slim-)?trixie", base.strip()), base


def test_installs_exactly_the_lock_and_the_project_without_resolving():
    runs = " && ".join(args for name, args in _instructions() if name == "RUN")
    installs = [
        cmd.strip() for cmd in re.split(r"&&|;", runs) if re.search(r"\bpip install\b", cmd)
    ]
    assert len(installs) == 2, installs
    lock_install, project_install = installs
    assert "--require-hashes" in lock_install and "--no-deps" in lock_install
    assert re.search(r"-r \S*requirements\.lock\b", lock_install)
    assert "--no-deps" in project_install and "--no-build-isolation" in project_install
    copies = [args for name, args in _instructions() if name == "COPY"]
    assert any(args.split()[0] == "requirements.lock" for args in copies)
    # The lock itself is complete and hashed: every pinned package carries a hash.
    lock = (REPO / "requirements.lock").read_text()
    pins = re.findall(r"^([A-Za-z0-9_.\-\[\]]+)==\S+ \\\n\s+--hash=sha256:", lock, re.M)
    assert len(pins) == len(re.findall(r"^[A-Za-z0-9_.\-\[\]]+==", lock, re.M)) > 100
    assert "setuptools" in {p.lower() for p in pins}  # no build isolation needs it from the lock


def test_entrypoint_is_the_command_of_the_compiled_spec():
    (entrypoint,) = [args for name, args in _instructions() if name == "ENTRYPOINT"]
    assert tuple(json.loads(entrypoint)) == ENTRYPOINT
    # TFJob replicas override it with TFX's run_executor, through the same interpreter.
    assert WORKER_COMMAND[:2] == ENTRYPOINT[:2]


def test_the_packages_the_spec_names_are_in_the_image():
    copies = [args.split() for name, args in _instructions() if name == "COPY"]
    assert any(src == "." for *sources, _ in copies for src in sources), "the repo is not copied"
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
