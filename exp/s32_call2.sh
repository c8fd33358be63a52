#!/usr/bin/env bash
# Thirty-second session, call 2 (on the trial merge s32-try: main + s32-wo + s32-gmm): the Mosaic GPU weight-only
# quantized matmul's GPU tests and timings (int8 with its tile candidates, mxfp8, nvfp8), then the grouped matmul's
# spans schedule (its GPU tests and timings).
set -u
. exp/s28_env.sh
gpu_tests 150 tests/quantization/test_quantized_matmul_mosaic_gpu.py tests/quantization/test_quantized_matmul_triton.py
cp "$OUT/gpu_tests.log" "$OUT/qmm_tests.log"
echo "=== qmm"
timeout 130 python3 exp/s32_qmm_mosaic.py int8 --tiles 2>&1 | quiet | tail -30
timeout 70 python3 exp/s32_qmm_mosaic.py mxfp8 nvfp8 2>&1 | quiet | tail -12
echo "=== gmm (from $SECONDS s)"
gpu_tests 120 tests/grouped_matmul/test_grouped_matmul_mosaic_gpu.py
timeout $((580 - SECONDS)) python3 exp/s32_gmm.py --stall 90 --repeats 10 \
    --only "mosaic tiles,mosaic spans,mosaic spans pingpong,mosaic spans pingpong bwd" 2>&1 | quiet | tail -30
