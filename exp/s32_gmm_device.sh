#!/usr/bin/env bash
# Thirty-second session, grouped matmul helper: first the GPU tests of the Mosaic GPU grouped matmul (the spans
# schedule among them: forward and both gradients against XLA), then the forward and forward+backward by schedule
# beside a dense matmul of the same work (`exp/s32_gmm.py`; its watchdog names a variant that deadlocks). Arguments
# go to the variants script (`--only ...`, `--skip ...`); GMM_TESTS=0 leaves the tests out.
set -u
. exp/s28_env.sh
if [ "${GMM_TESTS:-1}" = 1 ]; then
    gpu_tests 150 tests/grouped_matmul/test_grouped_matmul_mosaic_gpu.py
fi
echo "=== grouped matmul schedules"
timeout $((295 - SECONDS)) python3 exp/s32_gmm.py --stall 90 --repeats 10 "$@" 2>&1 | quiet | tail -40
