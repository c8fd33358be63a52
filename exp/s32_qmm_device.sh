#!/usr/bin/env bash
# Thirty-second session, weight-only quantized matmul helper (round two, issue 45): first the GPU tests of the Mosaic
# GPU decode kernel (its overlapped schedule against XLA at its default tiles in every mode and layout, auto's
# choice, the declines as measured), then the timings against Triton (`exp/s32_qmm_mosaic.py`; arguments go to it:
# modes, `--tiles`). QMM_TESTS=0 leaves the tests out. Within 250 s.
set -u
. exp/s28_env.sh
if [ "${QMM_TESTS:-1}" = 1 ]; then
    gpu_tests 110 tests/quantization/test_quantized_matmul_mosaic_gpu.py
fi
echo "=== quantized matmul, Mosaic GPU against Triton"
timeout $((245 - SECONDS)) python3 exp/s32_qmm_mosaic.py "$@" 2>&1 | quiet | tail -80
