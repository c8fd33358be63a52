#!/usr/bin/env bash
# Twenty-eighth session, second single-GPU call: the GPU tests of the new serving kernels (cascade, the Triton
# paged core's two passes, MLA, causal_conv1d, the ragged gated delta rule) and their benches.
set -u
. exp/s28_env.sh
gpu_tests 170 tests/serving_attention tests/test_causal_conv1d_triton.py tests/test_causal_conv1d.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py tests/flash_attention/test_triton.py
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
