# The images every Kubeflow step and every TFJob replica runs (see docs/kubeflow.md). Two targets
# from the runtime lock (requirements-runtime.lock: what pyproject.toml's dependencies and its
# `gpu` extra resolve to, at the versions of requirements.lock, without the `dev` group's test
# and lint tools):
#   gpu (the default)  the whole lock, CUDA 12 libraries included as wheels (tensorflow[and-cuda]):
#                      for the Trainer and TFJob replicas, which request nvidia.com/gpu.
#   cpu                the same minus the CUDA wheels (4.1 GB smaller): for the other steps.
# The CUDA libraries come from the wheels, not from an NVIDIA CUDA base image: they are the
# versions TensorFlow was built and tested against, pinned and hashed in the lock like
# everything else, the same files bin/envrun installs; the base stays Debian 13 for the
# ml-metadata and TFDV wheels (glibc >= 2.39). The driver comes from the node, as NVIDIA's
# device plugin and container toolkit hand it to a container.
#
# NOT BUILT on the machines this project is developed on: they have no Docker engine. What is
# checked there (tests/test_kubeflow_image.py): each stage installs exactly the runtime lock
# with hashes and resolves nothing else, no test or lint tool is in it, the cpu target drops
# exactly the lock's CUDA wheels, no compiler reaches a final image, both run as a non-root
# user, and their ENTRYPOINT is the command the compiled spec calls.
#
# Build from the repo root:
#   docker build -t <registry>/fullthrottle:0.1.0 .                        # gpu
#   docker build --target cpu -t <registry>/fullthrottle:0.1.0-cpu .
# then compile with:
#   fullthrottle compile --target kubeflow --image <registry>/fullthrottle:0.1.0 \
#       --cpu-image <registry>/fullthrottle:0.1.0-cpu

# Debian 13 (glibc 2.41): the ml-metadata and TFDV 1.21 wheels need glibc >= 2.39.
ARG PYTHON_IMAGE=python:3.13-slim-trixie

# --- build: the locked packages in a venv (g++ because pyfarmhash, a TFX dependency, has no
# cp313 wheel and compiles from source). Every package is pinned and hashed; --no-deps means
# nothing outside the lock can be pulled in.
FROM ${PYTHON_IMAGE} AS venv
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements-runtime.lock /opt/requirements.lock
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --require-hashes --no-deps -r /opt/requirements.lock \
    && /opt/venv/bin/pip check \
    && /opt/venv/bin/python -c "import tfx, tensorflow, apache_beam, mlflow, tensorflow_transform, tensorflow_data_validation, ml_metadata"

# The same venv without the CUDA wheels (TensorFlow's `and-cuda` extra: nothing else needs them).
FROM venv AS venv-cpu
RUN /opt/venv/bin/pip uninstall --yes $(grep -oE '^nvidia-[a-z0-9-]+-cu12' /opt/requirements.lock) \
    && /opt/venv/bin/pip check \
    && /opt/venv/bin/python -c "import tensorflow, tfx"

# --- what both images share: no compiler, a non-root user, the venv on PATH.
FROM ${PYTHON_IMAGE} AS runtime
RUN useradd --create-home --uid 10001 --user-group fullthrottle
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /opt/fullthrottle

# --- cpu: the steps that request no GPU.
FROM runtime AS cpu
COPY --from=venv-cpu /opt/venv /opt/venv
# The project, editable so its data files (bundled CSVs, curated schemas) stay beside the code.
# setuptools comes from the lock, hence no build isolation (which would fetch an unpinned one).
COPY . /opt/fullthrottle
RUN pip install --no-deps --no-build-isolation -e /opt/fullthrottle \
    && python -c "import trainer_module.run, trainer_module.transform, pipelines.pipeline, components.tfjob_trainer, serving.signatures"
USER fullthrottle
# The command of every step in the compiled KFP spec (TFX's v2 executor launcher). The spec sets
# it explicitly as well, so both agree; TFJob replicas override it with tfx.scripts.run_executor.
ENTRYPOINT ["python", "-m", "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor"]

# --- gpu (the default target): the Trainer and TFJob replicas.
FROM runtime AS gpu
# NVIDIA's container toolkit hands the node's driver (libcuda, libnvidia-ml, nvidia-smi) to
# containers that ask with these; GKE-style installs mount it at /usr/local/nvidia instead.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64 \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/nvidia/bin
COPY --from=venv /opt/venv /opt/venv
COPY . /opt/fullthrottle
RUN pip install --no-deps --no-build-isolation -e /opt/fullthrottle \
    && python -c "import trainer_module.run, trainer_module.transform, pipelines.pipeline, components.tfjob_trainer, serving.signatures"
USER fullthrottle
ENTRYPOINT ["python", "-m", "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor"]
