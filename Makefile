# `make demo` and `make test` work on a fresh machine: they create .venv with Python >= 3.12 if missing.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint gpu-test clean

$(STAMP): pyproject.toml
	@test -x $(PY) || "$$(tools/find-python)" -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ejkernel info
	$(VENV)/bin/ejkernel demo

test: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(PY) -m pytest -q -n 2 --dist loadgroup

gpu-test: $(STAMP)
	XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 $(PY) -m pytest -q -m gpu -n 4

clean:
	rm -rf $(VENV) .cache .pytest_cache
