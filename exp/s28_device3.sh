#!/usr/bin/env bash
# Twenty-eighth session, last single-GPU call: the new decode defaults (ragged gated delta rule at 64 value columns,
# MLA at 64 rows per step, the paged core's two-pass rule) through their GPU tests, the ragged gated delta rule's
# serving bench, and the Triton quantized_matmul's tilings.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 EJKERNEL_PERSISTENT_CACHE_DIR=/tmp/ejk-cache
quiet() { grep -v -e Warning -e "warnings.warn" -e "^\s*$" -e "return rule" ; }
XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 timeout 90 python3 -m pytest -q -rfE -m gpu -n 4 -p no:cacheprovider \
    tests/linear_attention/test_ragged_gated_delta_rule_triton.py tests/serving_attention/test_mla_triton.py \
    tests/serving_attention/test_paged_triton.py >"$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-300 | tail -12
echo "=== gdr"
timeout 75 python3 -m ejkernel.cli bench ragged_gated_delta_rule --part serving --repeats 10 --out "$OUT" >"$OUT/gdr.log" 2>&1
quiet <"$OUT/gdr.log" | tail -12
echo "=== qmm sweep"
timeout 90 python3 exp/s28_qmm_sweep.py 2>&1 | quiet | tail -24
