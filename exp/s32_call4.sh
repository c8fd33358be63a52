#!/usr/bin/env bash
# Thirty-second session, call 4 (trial merge s32-try4: main + s32-wo round two): the FP8 grouped matmul on spans
# (GPU tests, then timings beside the fixed tiles and bf16), then the Mosaic GPU weight-only quantized matmul's
# round two (GPU tests, then timings beside Triton).
set -u
. exp/s28_env.sh
gpu_tests 100 tests/grouped_matmul/test_grouped_matmul_mosaic_fp8.py -k "spans or default"
cp "$OUT/gpu_tests.log" "$OUT/fp8_tests.log"
echo "=== fp8 spans (from $SECONDS s)"
timeout 110 python3 exp/s32_fp8spans.py --stall 60 2>&1 | quiet | grep -v compiling | tail -12
echo "=== qmm tests (from $SECONDS s)"
gpu_tests 90 tests/quantization/test_quantized_matmul_mosaic_gpu.py
echo "=== qmm (from $SECONDS s)"
timeout $((540 - SECONDS)) python3 exp/s32_qmm_mosaic.py 2>&1 | quiet | tail -60
