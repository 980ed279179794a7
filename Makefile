# The two commands a newcomer needs are `make run` and `make test`; both build the locked
# environment on first use (bin/envrun). Everything else here is for developers.
ENVRUN := bin/envrun
SHELL := /bin/bash
PYTEST_ARGS ?=
LOCK_TARGET := --python-version 3.13 --python-platform x86_64-manylinux_2_39
UV_COMPILE := uv pip compile pyproject.toml $(LOCK_TARGET) --generate-hashes --quiet \
	--custom-compile-command "make lock"

.PHONY: run test test-fast test-external bench gpu-check lint lock env image

# The command learns it was started as `make TARGET ARGS=...` (to print how to run it again).
run bench gpu-check: export FULLTHROTTLE_MAKE_TARGET = $@

run:  ## the main job: the whole pipeline on the bundled Palmer Penguins data
	$(ENVRUN) fullthrottle run $(ARGS)

# Beam's DirectRunner runs a pipeline on one core: a worker per core and one more, for the time
# workers spend waiting on a server or a process to start (at most 4: each holds TensorFlow and
# its pipelines' memory); one test module per worker so that a module's shared runs are made once
# (the session's are shared through a lock, tests/helpers.once_per_session). Modules go out
# longest first (tests/conftest.py orders them; xdist would reorder by test count).
WORKERS := $(shell n=$$(($$(nproc) + 1)); echo $$((n > 4 ? 4 : n)))
XDIST := -n $(WORKERS) --dist loadscope --no-loadscope-reorder

test:  ## the test suite: real pipelines, servers and training (checks of outside systems aside)
	$(ENVRUN) python -m pytest $(XDIST) -m "not external" $(PYTEST_ARGS)

test-fast:  ## the edit-test loop: every test that runs no whole pipeline (< 3 minutes)
	$(ENVRUN) python -m pytest $(XDIST) -m "not slow and not external" $(PYTEST_ARGS)

test-external:  ## checks of systems outside the project: a fresh venv, the Kubeflow spec's tasks
	$(ENVRUN) python -m pytest -m external $(PYTEST_ARGS)

bench:  ## the benchmark suite; `make bench QUICK=1` for the < 5 minute version
	$(ENVRUN) fullthrottle bench $(if $(QUICK),--quick) $(ARGS)

gpu-check:  ## on a machine with NVIDIA GPUs: train on them, print examples/s, MFU, input wait
	$(ENVRUN) fullthrottle gpu-check $(ARGS)

lint:  ## ruff (lint + format), the import contracts of docs/architecture.md, hadolint (Dockerfile)
	$(ENVRUN) ruff check .
	$(ENVRUN) ruff format --check .
	$(ENVRUN) lint-imports --no-cache
	$(ENVRUN) hadolint Dockerfile

image:  ## the container image: `make image TARGET=cpu|gpu [TAG=name] [BASE=image|local]`
	bin/image --target $(or $(TARGET),gpu) $(if $(TAG),--tag $(TAG)) $(if $(BASE),--base $(BASE))

env:  ## build (or check) the environment only
	$(ENVRUN) python -c "import tfx, tensorflow; print('tfx', tfx.__version__, 'tensorflow', tensorflow.__version__)"

lock:  ## re-resolve pyproject.toml into the hashed locks (needs `uv` on the host)
	@# One resolution (with the gpu extra and the dev group), seeded with the current pins so that
	@# nothing moves without reason; then each install set at exactly its versions, and the gpu
	@# extra's part as the difference, which must be the same for the images and the environment.
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	cat requirements.lock $(wildcard requirements-gpu.lock) >"$$tmp/all.lock" && \
	$(UV_COMPILE) --extra gpu --group pyproject.toml:dev -o "$$tmp/all.lock" && \
	$(UV_COMPILE) --group pyproject.toml:dev -c "$$tmp/all.lock" -o requirements.lock && \
	$(UV_COMPILE) -c "$$tmp/all.lock" -o requirements-runtime.lock && \
	$(UV_COMPILE) --extra gpu -c "$$tmp/all.lock" -o "$$tmp/runtime-gpu.lock" && \
	bin/lock-subtract "$$tmp/all.lock" requirements.lock >"$$tmp/gpu-dev.lock" && \
	bin/lock-subtract "$$tmp/runtime-gpu.lock" requirements-runtime.lock >"$$tmp/gpu.lock" && \
	if ! diff <(grep -v '^ *#' "$$tmp/gpu-dev.lock") <(grep -v '^ *#' "$$tmp/gpu.lock") >&2; then \
		echo "make lock: the gpu extra adds different packages to the environment and to the images" >&2; \
		exit 1; fi && \
	{ echo "# What pyproject.toml's gpu extra adds to requirements.lock or requirements-runtime.lock,"; \
	  echo "# at the versions of the one resolution \`make lock\` made (see the Makefile). Never edit by hand."; \
	  cat "$$tmp/gpu.lock"; } >requirements-gpu.lock && \
	sed -i "\\#^ *\# *-c $$tmp/#d" requirements.lock requirements-runtime.lock requirements-gpu.lock
