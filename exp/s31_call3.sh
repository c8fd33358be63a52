#!/usr/bin/env bash
# Thirty-first session, call 3 (branch s31-try: main + the MLA and FP8 grouped-matmul helpers' branches): the GPU
# tests of both new Mosaic GPU kernels (and of the kernels they sit beside), then each one's variants.
set -u
. exp/s28_env.sh
gpu_tests 210 tests/serving_attention/test_mla_mosaic_gpu.py tests/serving_attention/test_mla_triton.py \
    tests/grouped_matmul/test_grouped_matmul_mosaic_fp8.py tests/grouped_matmul/test_grouped_matmul_mosaic_gpu.py
echo "=== mla variants"
(cd exp && timeout $((390 - SECONDS)) python3 s31_mla.py --stall 90 2>&1 | quiet | tail -20)
echo "=== fp8 grouped matmul variants"
timeout $((585 - SECONDS)) python3 exp/s31_fp8gmm.py --stall 90 2>&1 | quiet | tail -20
