#!/usr/bin/env bash
# Twenty-eighth session, third single-GPU call: quantized_matmul's Triton kernel (GPU tests, bench), the Triton
# causal_conv1d bench, and the tilings of the ragged gated delta rule's decode and MLA's paged decode.
set -u
. exp/s28_env.sh
gpu_tests 110 tests/quantization/test_quantized_matmul_triton.py
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
