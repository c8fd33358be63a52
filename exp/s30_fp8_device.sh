#!/usr/bin/env bash
# Thirtieth session, fp8 helper: the float8 forward's schedules and tiles (overlapped, 64-key tiles, deeper rings),
# first their GPU tests (each variant against the reference at S 4096), then TFLOP/s by variant beside our bf16
# forward and cuDNN bf16 (`exp/s30_fp8_variants.py`; its watchdog names a variant that deadlocks). Arguments go to
# the variants script (`--causal no`, `--only ...`, `--skip ...`); FP8_TESTS=0 leaves the tests out.
set -u
. exp/s28_env.sh
if [ "${FP8_TESTS:-1}" = 1 ]; then
    gpu_tests 200 tests/flash_attention/test_float8.py
fi
echo "=== fp8 variants"
timeout $((585 - SECONDS)) python3 exp/s30_fp8_variants.py --stall 120 "$@" 2>&1 | quiet | tail -90
