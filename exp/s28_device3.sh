#!/usr/bin/env bash
# Twenty-eighth session, last single-GPU call: the new decode defaults (ragged gated delta rule at 64 value columns,
# MLA at 64 rows per step, the paged core's two-pass rule) through their GPU tests, the ragged gated delta rule's
# serving bench, and the Triton quantized_matmul's tilings.
set -u
. exp/s28_env.sh
gpu_tests 90 tests/linear_attention/test_ragged_gated_delta_rule_triton.py tests/serving_attention/test_mla_triton.py tests/serving_attention/test_paged_triton.py
echo "=== gdr"
timeout 75 python3 -m ejkernel.cli bench ragged_gated_delta_rule --part serving --repeats 10 --out "$OUT" >"$OUT/gdr.log" 2>&1
quiet <"$OUT/gdr.log" | tail -12
echo "=== qmm sweep"
timeout 90 python3 exp/s28_qmm_sweep.py 2>&1 | quiet | tail -24
