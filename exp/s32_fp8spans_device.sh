#!/usr/bin/env bash
# Thirty-second session, FP8 grouped matmul on spans: first the GPU tests of the spans option (the MoE shape with 4
# stages, forward and gradients against XLA; M 6003 with unaligned groups, forward), then `exp/s32_fp8spans.py` at
# the MoE shape (bf16 auto, bf16 spans ping-pong, both pre-passes, a copy of lhs, the FP8 default and the spans rows).
# Arguments go to the script (`--only ...`); FP8_TESTS=0 leaves the tests out. At most 250 s in all.
set -u
. exp/s28_env.sh
if [ "${FP8_TESTS:-1}" = 1 ]; then
    gpu_tests 100 tests/grouped_matmul/test_grouped_matmul_mosaic_fp8.py -k "spans"
fi
echo "=== fp8 grouped matmul on spans"
timeout $((245 - SECONDS)) python3 exp/s32_fp8spans.py --stall 90 "$@" 2>&1 | quiet | grep -v compiling | tail -16
