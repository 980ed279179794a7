# The images every Kubeflow step and every TFJob replica runs (see docs/kubeflow.md). Two targets
# from one resolution of pyproject.toml (`make lock`):
#   cpu            requirements-runtime.lock: the runtime dependencies, no test or lint tool, no
#                  CUDA. For every step that requests no GPU.
#   gpu (default)  the cpu image plus requirements-gpu.lock, the `gpu` extra: the CUDA 12 wheels
#                  TensorFlow loads, and NVML. For the Trainer and TFJob replicas with a GPU.
# The CUDA libraries come from the wheels, not from an NVIDIA CUDA base image: they are the
# versions TensorFlow was built and tested against, pinned and hashed in the lock like everything
# else, the same files bin/envrun installs. The driver comes from the node, as NVIDIA's device
# plugin and container toolkit hand it to a container.
#
# Build from the repo root (`make image` does it with docker, or with buildah where no Docker
# engine runs, and makes a local base where the default one cannot be pulled):
#   docker build --target cpu -t <registry>/fullthrottle:0.1.0-cpu .
#   docker build -t <registry>/fullthrottle:0.1.0 .                      # gpu
# Downloaded wheels stay in a build cache (`fullthrottle-wheels`): a second build, or the other
# target, downloads nothing again.

# Python 3.13 on Debian 13 (glibc 2.41): the ml-metadata and TFDV 1.21 wheels need glibc >= 2.39.
# Any base with those works: `make image` makes one with mmdebstrap where this cannot be pulled.
ARG BASE_IMAGE=python:3.13-slim-trixie

# --- build: the runtime lock in a venv. g++ because pyfarmhash, a TFX dependency, has no cp313
# wheel and compiles from source, with Python's headers (a Debian python3 base lacks them).
# Every package is pinned and hashed; --no-deps means nothing outside the lock can come in.
FROM ${BASE_IMAGE} AS build
# hadolint ignore=DL3008
RUN headers=python3-dev \
    && if python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("include"), "Python.h")))'; then headers=""; fi \
    && apt-get update \
    && apt-get install -y --no-install-recommends g++ ${headers:+"$headers"} \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements-runtime.lock /opt/locks/
# Only the wheels the cache lacks are downloaded (pip checks every hash), one downloader at a time.
RUN --mount=type=cache,id=fullthrottle-wheels,target=/var/cache/fullthrottle-wheels,sharing=locked \
    python3 -m venv /opt/venv \
    && flock /var/cache/fullthrottle-wheels/.lock /opt/venv/bin/pip download --quiet --no-deps \
        --require-hashes -r /opt/locks/requirements-runtime.lock -d /var/cache/fullthrottle-wheels \
    && /opt/venv/bin/pip install --quiet --no-deps --require-hashes --no-index \
        --find-links /var/cache/fullthrottle-wheels -r /opt/locks/requirements-runtime.lock \
    && /opt/venv/bin/pip check \
    && /opt/venv/bin/python -c "import tfx, tensorflow, apache_beam, mlflow, tensorflow_transform, tensorflow_data_validation, ml_metadata"

# --- what both images share: no compiler, a non-root user (numeric, so that Kubernetes'
# `runAsNonRoot` can check it), the venv on PATH.
FROM ${BASE_IMAGE} AS runtime
RUN useradd --create-home --uid 10001 --user-group fullthrottle
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY --from=build /opt/venv /opt/venv
WORKDIR /opt/fullthrottle

# --- the CUDA wheels on top (binary wheels only: no compiler needed).
FROM runtime AS runtime-gpu
COPY requirements-gpu.lock /opt/locks/
RUN --mount=type=cache,id=fullthrottle-wheels,target=/var/cache/fullthrottle-wheels,sharing=locked \
    flock /var/cache/fullthrottle-wheels/.lock pip download --quiet --no-deps --require-hashes \
        -r /opt/locks/requirements-gpu.lock -d /var/cache/fullthrottle-wheels \
    && pip install --quiet --no-deps --require-hashes --no-index \
        --find-links /var/cache/fullthrottle-wheels -r /opt/locks/requirements-gpu.lock \
    && pip check
# NVIDIA's container toolkit hands the node's driver (libcuda, libnvidia-ml, nvidia-smi) to
# containers that ask with these; GKE-style installs mount it at /usr/local/nvidia instead.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64 \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/nvidia/bin

# --- cpu: the steps that request no GPU.
FROM runtime AS cpu
# The project, editable so its data files (bundled CSVs, curated schemas) stay beside the code.
# setuptools comes from the lock, hence no build isolation (which would fetch an unpinned one).
COPY . /opt/fullthrottle
RUN pip install --quiet --no-deps --no-build-isolation -e /opt/fullthrottle \
    && python -c "import trainer_module.run, trainer_module.transform, pipelines.pipeline, components.tfjob_trainer, serving.signatures"
USER 10001:10001
# The command of every step in the compiled KFP spec (TFX's v2 executor launcher). The spec sets
# it explicitly as well, so both agree; TFJob replicas override it with tfx.scripts.run_executor.
ENTRYPOINT ["python", "-m", "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor"]

# --- gpu (the default target): the Trainer and TFJob replicas. The same project on top of the
# CUDA wheels; the build fails unless TensorFlow's CUDA libraries load (no GPU needed for that).
FROM runtime-gpu AS gpu
COPY . /opt/fullthrottle
RUN pip install --quiet --no-deps --no-build-isolation -e /opt/fullthrottle \
    && python -c "import trainer_module.run, trainer_module.transform, pipelines.pipeline, components.tfjob_trainer, serving.signatures" \
    && python -c "from trainer_module.training import hardware; missing = [lib.soname for lib in hardware.cuda_libraries() if not lib.loaded]; assert hardware.cuda_libraries() and not missing, missing"
USER 10001:10001
ENTRYPOINT ["python", "-m", "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor"]
