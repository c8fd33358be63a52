#!/usr/bin/env bash
# Twenty-ninth session, call 5: the serving, grouped-matmul and quantized-matmul GPU tests (one failed unnamed in
# call 4's cut-off run), then the 8-bit cache default tiling against alternatives (per-token-head scales) and the
# KV-scales bench at it.
set -u
. exp/s28_env.sh
gpu_tests 240 tests/serving_attention/test_paged_kv_scales.py tests/serving_attention/test_paged_triton.py \
    tests/serving_attention/test_mla_triton.py tests/grouped_matmul/test_grouped_matmul_quantized.py \
    tests/grouped_matmul/test_grouped_matmul_kernels.py tests/quantization/test_quantized_matmul_triton.py
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -5; grep -E "^E  " "$OUT/gpu_tests.log" | head -8
echo "=== sweep"
timeout 140 python3 exp/s29_fp8_sweep.py 2>&1 | quiet | tail -10
echo "=== kvscales"
timeout 50 python3 exp/s29_kvscales.py 2>&1 | quiet | tail -3
