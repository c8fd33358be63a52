#!/usr/bin/env bash
# Thirty-first session, FP8 grouped matmul helper: first the GPU tests of the Mosaic GPU FP8 forward and of the bf16
# Mosaic GPU grouped matmul (whose forward's group walk it now shares), then the FP8 forward by tiling beside the
# bf16 forwards and the Triton FP8 paths at the MoE shape (`exp/s31_fp8gmm.py`; its watchdog names a tiling that
# deadlocks). Arguments go to the variants script (`--only ...`, `--skip ...`); FP8_TESTS=0 leaves the tests out.
set -u
. exp/s28_env.sh
if [ "${FP8_TESTS:-1}" = 1 ]; then
    gpu_tests 300 tests/grouped_matmul/test_grouped_matmul_mosaic_fp8.py tests/grouped_matmul/test_grouped_matmul_mosaic_gpu.py
fi
echo "=== fp8 grouped matmul variants"
timeout $((585 - SECONDS)) python3 exp/s31_fp8gmm.py --stall 120 "$@" 2>&1 | quiet | tail -40
