#!/usr/bin/env bash
# Twenty-eighth session, second single-GPU call: the GPU tests of the new serving kernels (cascade, the Triton
# paged core's two passes, MLA, causal_conv1d, the ragged gated delta rule) and their benches.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 EJKERNEL_PERSISTENT_CACHE_DIR=/tmp/ejk-cache
quiet() { grep -v -e Warning -e "warnings.warn" -e "^\s*$" -e "return rule" ; }
XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 timeout 170 python3 -m pytest -q -rfE -m gpu -n 4 -p no:cacheprovider \
    tests/serving_attention tests/test_causal_conv1d_triton.py tests/test_causal_conv1d.py \
    tests/linear_attention/test_ragged_gated_delta_rule_triton.py tests/flash_attention/test_triton.py \
    >"$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-300 | tail -12
bench() {  # bench <name> <seconds> <args...>
    local name=$1 limit=$2
    shift 2
    echo "=== $name: $*"
    timeout "$limit" python3 -m ejkernel.cli bench "$@" --out "$OUT" >"$OUT/$name.log" 2>&1
    quiet <"$OUT/$name.log" | tail -24
}
bench conv 75 causal_conv1d --sweep --repeats 10
bench gdr 95 ragged_gated_delta_rule --part serving --repeats 10
bench mla 85 mla --cases paged --repeats 10
echo "=== mixed sweep"
timeout 90 python3 exp/s28_mixed_sweep.py 2>&1 | quiet | tail -24
