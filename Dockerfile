# The image every Kubeflow step and every TFJob replica runs (see docs/kubeflow.md).
#
# NOT BUILT on the machines this project is developed on: they have no Docker engine. What is
# checked there (tests/test_kubeflow_image.py): it installs exactly requirements.lock with
# hashes and without resolving anything else, on Python 3.13; it carries the packages the
# compiled spec reaches by dotted name; its ENTRYPOINT is the command the compiled spec calls.
#
# Build from the repo root:  docker build -t <registry>/fullthrottle:0.1.0 .
# then compile with:         fullthrottle compile --target kubeflow --image <registry>/fullthrottle:0.1.0

# Debian 13 (glibc 2.41): the ml-metadata and TFDV 1.21 wheels need glibc >= 2.39.
FROM python:3.13-slim-trixie

# g++ because pyfarmhash (a TFX dependency) has no cp313 wheel and compiles from source.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The locked dependencies first (their own layer: it changes only with the lock). Every package
# is pinned and hashed; --no-deps means nothing outside the lock can be pulled in.
COPY requirements.lock /tmp/requirements.lock
RUN pip install --require-hashes --no-deps -r /tmp/requirements.lock && rm /tmp/requirements.lock

# The project, editable so its data files (bundled CSVs, curated schemas) stay beside the code.
# setuptools comes from the lock, hence no build isolation (which would fetch an unpinned one).
WORKDIR /opt/fullthrottle
COPY . /opt/fullthrottle
RUN pip install --no-deps --no-build-isolation -e /opt/fullthrottle \
    && python -c "import trainer_module.run, trainer_module.transform, pipelines.pipeline, components.tfjob_trainer, serving.signatures"

# The command of every step in the compiled KFP spec (TFX's v2 executor launcher). The spec sets
# it explicitly as well, so both agree; TFJob replicas override it with tfx.scripts.run_executor.
ENTRYPOINT ["python", "-m", "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor"]
