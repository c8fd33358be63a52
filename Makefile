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

$(STAMP): pyproject.toml
	@test -x $(PY) || "$$(tools/find-python)" -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench,docs]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ejkernel info
	$(VENV)/bin/ejkernel demo

test: unit unit-lowest integration docs

unit: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(PY) -m pytest -q -n 2 --dist loadgroup --ignore=tests/test_docs.py

$(LOWEST_STAMP): pyproject.toml
	@test -x $(LOWEST)/bin/python || "$$(tools/find-python)" -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install -q --upgrade pip
	$(LOWEST)/bin/python -m pip install -q -e '.[test,bench]' "jax==$(JAX_LOWEST)"
	@touch $@

# `unit-lowest` runs what depends on the JAX version beneath it: every op's public call and XLA implementation
# (the path every platform has) and the framework. The rest runs once, in `unit`: what checks our own harness (the
# demo, the benchmarks' CLI tests, the reliability suite: about 4-5 minutes of a cold run on 2 cores); the call
# forms of upstream, the seeds and the README (argument forms over the same ops); and the kernels' own test files
# (Triton, Mosaic GPU, Pallas TPU: about 3 minutes at the lowest JAX), their interpret-mode runs and lowerings for
# CUDA: the lowest JAX is the one the GPU machines run, where the GPU suite compiles every GPU kernel for real.
# Variants of cases the lowest JAX runs already, and numerics that do not depend on the version (about 40 s).
NEWEST_ONLY := "tests/sparse_attention/test_native_sparse.py::test_public_sliding_window_packed_at_tile_lengths[eager]" \
	"tests/sparse_attention/test_native_sparse.py::test_public_sliding_window_packed_at_tile_lengths[jit]" \
	tests/sparse_attention/test_native_sparse.py::test_config_block_size_never_changes_the_result \
	"tests/serving_attention/test_paged_kv_scales.py::test_v3_write_quantises_each_token_head[int8]" \
	tests/test_ring_attention.py::test_mesh_causal_mirrored_on_an_odd_ring_with_window \
	tests/linear_attention/test_linear_xla.py::test_long_sequence_strong_gates_stay_finite_and_exact
UNIT_ONLY := --ignore=tests/reliability --ignore-glob='*_triton.py' \
	--ignore-glob='*_mosaic_gpu.py' --ignore-glob='*_mosaic_fp8.py' --ignore-glob='*pallas_tpu.py' \
	--ignore=tests/sparse_attention/test_kernels.py --ignore=tests/test_upstream_call_forms.py \
	--ignore=tests/test_drop_in.py --ignore=tests/test_seed_examples.py --ignore=tests/test_readme.py \
	--deselect tests/test_cli.py::test_demo_checks_every_op_against_its_reference \
	$(addprefix --deselect ,$(NEWEST_ONLY))
unit-lowest: $(LOWEST_STAMP)
	$(LOWEST)/bin/python -m pytest -q -n 2 --dist loadgroup --ignore=tests/test_docs.py $(UNIT_ONLY) -k "not bench and not interpret and not lowers_ and not for_cuda"

# EasyDeL 0.3.0 itself without its pins (ejkernel 0.0.78, flax 0.12.3): everything else it declares is in
# tests/integration/requirements.txt.
$(INTEGRATION_STAMP): pyproject.toml tests/integration/requirements.txt
	@test -x $(INTEGRATION)/bin/python || "$$(tools/find-python)" -m venv $(INTEGRATION)
	$(INTEGRATION)/bin/python -m pip install -q --upgrade pip
	$(INTEGRATION)/bin/python -m pip install -q -e '.[test]' -r tests/integration/requirements.txt
	$(INTEGRATION)/bin/python -m pip install -q --no-deps easydel==0.3.0
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
