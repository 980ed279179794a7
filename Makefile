# The two commands a newcomer needs are `make run` and `make test`; both build the locked
# environment on first use (bin/envrun). Everything else here is for developers.
ENVRUN := bin/envrun
PYTEST_ARGS ?=
LOCK_TARGET := --python-version 3.13 --python-platform x86_64-manylinux_2_39

.PHONY: run test test-fast test-external bench gpu-check lint lock env

# The command learns it was started as `make TARGET ARGS=...` (to print how to run it again).
run bench gpu-check: export FULLTHROTTLE_MAKE_TARGET = $@

run:  ## the main job: the whole pipeline on the bundled Palmer Penguins data
	$(ENVRUN) fullthrottle run $(ARGS)

test:  ## the test suite: real pipelines, servers and training (checks of outside systems aside)
	$(ENVRUN) python -m pytest -m "not external" $(PYTEST_ARGS)

test-fast:  ## the edit-test loop: every test that runs no whole pipeline (< 3 minutes)
	$(ENVRUN) python -m pytest -m "not slow and not external" $(PYTEST_ARGS)

test-external:  ## checks of systems outside the project: a fresh venv, the Kubeflow spec's tasks
	$(ENVRUN) python -m pytest -m external $(PYTEST_ARGS)

bench:  ## the benchmark suite; `make bench QUICK=1` for the < 5 minute version
	$(ENVRUN) fullthrottle bench $(if $(QUICK),--quick) $(ARGS)

gpu-check:  ## on a machine with NVIDIA GPUs: train on them, print examples/s, MFU, input wait
	$(ENVRUN) fullthrottle gpu-check $(ARGS)

lint:  ## ruff (lint + format) and the import contracts of docs/architecture.md
	$(ENVRUN) ruff check .
	$(ENVRUN) ruff format --check .
	$(ENVRUN) lint-imports --no-cache

env:  ## build (or check) the environment only
	$(ENVRUN) python -c "import tfx, tensorflow; print('tfx', tfx.__version__, 'tensorflow', tensorflow.__version__)"

lock:  ## re-resolve pyproject.toml into the hashed locks (needs `uv` on the host)
	uv pip compile pyproject.toml --extra gpu --group pyproject.toml:dev $(LOCK_TARGET) \
		--generate-hashes --quiet -o requirements.lock
	uv pip compile pyproject.toml --extra gpu -c requirements.lock $(LOCK_TARGET) \
		--generate-hashes --quiet -o requirements-runtime.lock
