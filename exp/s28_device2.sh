#!/usr/bin/env bash
# Twenty-eighth session, third single-GPU call: quantized_matmul's Triton kernel (GPU tests, bench), the Triton
# causal_conv1d bench, and the tilings of the ragged gated delta rule's decode and MLA's paged decode.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 EJKERNEL_PERSISTENT_CACHE_DIR=/tmp/ejk-cache
quiet() { grep -v -e Warning -e "warnings.warn" -e "^\s*$" -e "return rule" ; }
XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 timeout 110 python3 -m pytest -q -rfE -m gpu -n 4 -p no:cacheprovider \
    tests/quantization/test_quantized_matmul_triton.py >"$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-300 | tail -12
bench() {  # bench <name> <seconds> <args...>
    local name=$1 limit=$2
    shift 2
    echo "=== $name: $*"
    timeout "$limit" python3 -m ejkernel.cli bench "$@" --out "$OUT" >"$OUT/$name.log" 2>&1
    quiet <"$OUT/$name.log" | tail -30
}
bench conv 80 causal_conv1d --repeats 10
bench qmm 100 quantized_matmul --repeats 10
echo "=== sweeps"
timeout 100 python3 exp/s28_sweeps.py 2>&1 | quiet | tail -30
