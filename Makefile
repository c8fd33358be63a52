# `make demo` and `make test` work on a fresh machine: they create .venv (and, for the EasyDeL suite,
# .venv-integration, .venv-jax-lowest) with Python >= 3.12 if missing.
# `make test` = `make unit` + `make unit-lowest` + `make integration` + `make docs` (what CI runs).
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

INTEGRATION := .venv-integration
INTEGRATION_STAMP := $(INTEGRATION)/.installed

# The lowest JAX pyproject.toml allows (`jax>=X,...`): `make unit` runs on the newest that pip picks,
# `make unit-lowest` on this one, so that both ends of the range are tested.
JAX_LOWEST := $(shell sed -n 's/^ *"jax>=\([0-9.]*\),.*/\1/p' pyproject.toml)
LOWEST := .venv-jax-lowest
LOWEST_STAMP := $(LOWEST)/.installed

.PHONY: demo test unit unit-lowest integration docs lint gpu-test clean

# Every Python process of the test command imports JAX and this package (the pytest workers, the fresh processes
# some tests start, the EasyDeL suite's): with PYTHONDONTWRITEBYTECODE set (as it is on these machines), each one
# compiled all of that source again (measured here: 1.6 s a process for JAX and ejkernel, 5 s for a pytest worker's
# collection). The first process writes the bytecode; the others read it.
unexport PYTHONDONTWRITEBYTECODE

# pip installs without byte-compiling every module (those imported compile as they are first imported): 19 s in
# place of 48 s for .venv on a 2-core machine, more for the EasyDeL environment.
$(STAMP): pyproject.toml
	@test -x $(PY) || "$$(tools/find-python)" -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[test,bench,docs]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ejkernel info
	$(VENV)/bin/ejkernel demo

test: unit unit-lowest integration docs

unit: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not lowest" --ignore=tests/test_docs.py

$(LOWEST_STAMP): pyproject.toml
	@test -x $(LOWEST)/bin/python || "$$(tools/find-python)" -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install -q --upgrade pip
	$(LOWEST)/bin/python -m pip install -q --no-compile -e '.[test,bench]' "jax==$(JAX_LOWEST)"
	@touch $@

# Each test runs once, at one of the two ends of the JAX versions the package allows. `unit-lowest` runs the tests
# marked `lowest` at the lowest (the one the GPU machines run, where the GPU suite compiles every GPU kernel for real):
# the framework (dispatch, selection, caches, autotuning, configs, the registry), and per op family its public call
# against the reference (forward and gradients), a sharded call and its bad-input errors, so that what a version
# changes (jit, custom VJPs, shard_map, dtypes) is met on every family's path. `unit` runs the rest at the newest:
# the variants of those calls, the kernels, the reliability suite, the harness.
unit-lowest: $(LOWEST_STAMP)
	$(LOWEST)/bin/python -m pytest -q -n 2 --dist loadgroup -m lowest --ignore=tests/test_docs.py

# EasyDeL 0.3.0 itself without its pins (ejkernel 0.0.78, flax 0.12.3): everything else it declares is in
# tests/integration/requirements.txt.
$(INTEGRATION_STAMP): pyproject.toml tests/integration/requirements.txt
	@test -x $(INTEGRATION)/bin/python || "$$(tools/find-python)" -m venv $(INTEGRATION)
	$(INTEGRATION)/bin/python -m pip install -q --upgrade pip
	$(INTEGRATION)/bin/python -m pip install -q --no-compile -e '.[test]' -r tests/integration/requirements.txt
	$(INTEGRATION)/bin/python -m pip install -q --no-compile --no-deps easydel==0.3.0
	@touch $@

integration: $(INTEGRATION_STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=1 $(INTEGRATION)/bin/python -m pytest -q -n 2 tests/integration/test_easydel.py
	XLA_FLAGS=--xla_force_host_platform_device_count=8 \
		$(INTEGRATION)/bin/python -m pytest -q -n 2 tests/integration/test_easydel_sharded.py

# The documentation site (docs/_build/html), from a fresh environment with warnings as errors; then every
# Python example of its pages and every docstring example (tests/test_docs.py).
docs: $(STAMP)
	$(VENV)/bin/sphinx-build -E -W --keep-going -q -b html docs docs/_build/html
	$(PY) -m pytest -q -n 2 -rfEx tests/test_docs.py

gpu-test: $(STAMP)
	XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 $(PY) -m pytest -q -m gpu -n 4

clean:
	rm -rf $(VENV) $(INTEGRATION) $(LOWEST) .cache .pytest_cache docs/_build docs/_build
