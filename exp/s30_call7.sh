#!/usr/bin/env bash
# Thirtieth session, call 7: 4-bit codes as nibble phases in quantized matmul: GPU tests, then the defaults' times.
set -u
. exp/s28_env.sh
gpu_tests 100 tests/quantization/test_quantized_matmul_triton.py -k "affine-4 or mxfp4 or auto_picks"
echo "=== qmm 4-bit at the defaults"
timeout $((170 - SECONDS)) python3 exp/s30_qmm_bytes.py int4 mxfp4 nf4 --defaults 2>&1 | quiet | tail -8
