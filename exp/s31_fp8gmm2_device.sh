#!/usr/bin/env bash
# Thirty-first session, FP8 grouped matmul round two: first the GPU tests of the Mosaic GPU FP8 forward (the rounding
# pass bit for bit against `fp8_row_blocks`; the forward and gradients against XLA with both switches on, off, and
# with per-column and per-128-column weight scales), then `exp/s31_fp8gmm2.py` at the MoE shape (bf16 auto, both
# pre-passes, a copy of lhs, the FP8 forwards old and new). Arguments go to the script (`--only ...`); FP8_TESTS=0
# leaves the tests out. About 300 s in all.
set -u
. exp/s28_env.sh
if [ "${FP8_TESTS:-1}" = 1 ]; then
    gpu_tests 170 tests/grouped_matmul/test_grouped_matmul_mosaic_fp8.py
fi
echo "=== fp8 grouped matmul, round two"
timeout $((295 - SECONDS)) python3 exp/s31_fp8gmm2.py --stall 90 "$@" 2>&1 | quiet | tail -30
