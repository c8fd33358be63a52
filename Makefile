# `make demo` and `make test` work on a fresh machine: they create .venv (and, for the EasyDeL suite,
# .venv-integration) with Python >= 3.12 if missing. `make test` = `make unit` + `make integration`.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

INTEGRATION := .venv-integration
INTEGRATION_STAMP := $(INTEGRATION)/.installed

.PHONY: demo test unit integration lint gpu-test clean

$(STAMP): pyproject.toml
	@test -x $(PY) || "$$(tools/find-python)" -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ejkernel info
	$(VENV)/bin/ejkernel demo

test: unit integration

unit: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(PY) -m pytest -q -n 2 --dist loadgroup

# EasyDeL 0.3.0 itself without its pins (ejkernel 0.0.78, flax 0.12.3): everything else it declares is in
# tests/integration/requirements.txt.
$(INTEGRATION_STAMP): pyproject.toml tests/integration/requirements.txt
	@test -x $(INTEGRATION)/bin/python || "$$(tools/find-python)" -m venv $(INTEGRATION)
	$(INTEGRATION)/bin/python -m pip install -q --upgrade pip
	$(INTEGRATION)/bin/python -m pip install -q -e '.[test]' -r tests/integration/requirements.txt
	$(INTEGRATION)/bin/python -m pip install -q --no-deps easydel==0.3.0
	@touch $@

integration: $(INTEGRATION_STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=1 $(INTEGRATION)/bin/python -m pytest -q tests/integration/test_easydel.py
	XLA_FLAGS=--xla_force_host_platform_device_count=8 \
		$(INTEGRATION)/bin/python -m pytest -q tests/integration/test_easydel_sharded.py

gpu-test: $(STAMP)
	XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 $(PY) -m pytest -q -m gpu -n 4

clean:
	rm -rf $(VENV) $(INTEGRATION) .cache .pytest_cache
