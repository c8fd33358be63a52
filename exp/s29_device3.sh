#!/usr/bin/env bash
# Twenty-ninth session, call 4: per-token-head fp8/int8 KV caches and quantized grouped matmul (issue 45), merged
# from the helpers: their GPU tests, the KV-scales decode bench and tiling sweep, the quantized MoE bench.
set -u
. exp/s28_env.sh
gpu_tests 200 tests/serving_attention/test_paged_kv_scales.py tests/serving_attention/test_paged_triton.py \
    tests/serving_attention/test_mla_triton.py tests/grouped_matmul/test_grouped_matmul_quantized.py \
    tests/grouped_matmul/test_grouped_matmul_kernels.py tests/quantization/test_quantized_matmul_triton.py
echo "=== kvscales"
timeout 60 python3 exp/s29_kvscales.py 2>&1 | quiet | tail -4
echo "=== sweep"
timeout 110 python3 exp/s29_fp8_sweep.py 2>&1 | quiet | tail -18
echo "=== gmm quantized"
timeout 150 python3 -m ejkernel.cli bench grouped_matmul --part quantized --out "$OUT" 2>&1 | quiet | tail -14
