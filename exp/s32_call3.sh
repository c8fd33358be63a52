#!/usr/bin/env bash
# Thirty-second session, call 3 (trial merge s32-try3: 9ed93f9 + s32-fp8gmm3 + s32-prefill2): the FP8 grouped matmul's
# round-three tilings (GPU tests, timings), then the persistent grid of the Mosaic GPU prefill tiles (GPU tests,
# timings, the compiled program's order).
set -u
. exp/s28_env.sh
gpu_tests 120 tests/grouped_matmul/test_grouped_matmul_mosaic_fp8.py -k "rounding or default or row-chunks or pingpong or interleave"
cp "$OUT/gpu_tests.log" "$OUT/fp8_tests.log"
echo "=== fp8 grouped matmul (from $SECONDS s)"
timeout 130 python3 exp/s32_fp8gmm.py --stall 60 2>&1 | quiet | grep -v compiling | tail -16
echo "=== prefill tests (from $SECONDS s)"
gpu_tests 110 tests/serving_attention/test_paged_mosaic_gpu.py
echo "=== prefill (from $SECONDS s)"
timeout $((585 - SECONDS)) python3 exp/s32_prefill.py --hlo --stall 90 --repeats 10 >"$OUT/prefill.log" 2>&1
quiet <"$OUT/prefill.log" | grep -v compiling | grep -v "^ *%\|custom-call\|fusion" | tail -40
