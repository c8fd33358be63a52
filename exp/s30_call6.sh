#!/usr/bin/env bash
# Thirtieth session, call 6: E4M3 codes (mxfp8, nvfp8) read as float8 and 8-bit grouped-matmul codes as bytes: their
# GPU tests, then the quantized matmul's 8-bit modes at the heuristic's tiles.
set -u
. exp/s28_env.sh
gpu_tests 170 tests/quantization/test_quantized_matmul_triton.py tests/grouped_matmul/test_grouped_matmul_quantized.py \
    -k "mxfp8 or nvfp8 or affine-8 or grouped"
echo "=== qmm 8-bit at the defaults"
timeout $((330 - SECONDS)) python3 exp/s30_qmm_bytes.py mxfp8 nvfp8 int8 --defaults 2>&1 | quiet | tail -12
