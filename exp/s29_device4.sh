#!/usr/bin/env bash
# Twenty-ninth session, call 5: the 8-bit cache default tiling against alternatives (with per-token-head scales),
# the KV-scales bench at it, then the serving and grouped-matmul GPU tests (quantized_matmul's passed in call 4).
set -u
. exp/s28_env.sh
echo "=== sweep"
timeout 150 python3 exp/s29_fp8_sweep.py 2>&1 | quiet | tail -10
echo "=== kvscales"
timeout 50 python3 exp/s29_kvscales.py 2>&1 | quiet | tail -3
gpu_tests 200 tests/serving_attention/test_paged_kv_scales.py tests/serving_attention/test_paged_triton.py \
    tests/serving_attention/test_mla_triton.py tests/grouped_matmul/test_grouped_matmul_quantized.py \
    tests/grouped_matmul/test_grouped_matmul_kernels.py
