#!/usr/bin/env bash
# Thirtieth session (issue 45): the quantized matmul's GPU tests (the decode variants compiled against XLA), then
# the variant sweep at K = N = 8192, M 16 and 64, both layouts, one mode a process (each about 60 kernels).
# `bash exp/s30_device.sh [modes...]` (default: every mode of the sweep; about 150 s a mode); SKIP_TESTS=1 skips
# the tests (about 4 minutes).
set -u
. exp/s28_env.sh
[ "${SKIP_TESTS:-0}" = 1 ] || gpu_tests 240 tests/quantization/test_quantized_matmul_triton.py
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(int4_g64 int8_g64 int4_g128 int8_g128 nf4 mxfp4)
for mode in "${modes[@]}"; do
    echo "=== $mode"
    timeout 180 python3 exp/s30_qmm_variants.py --modes "$mode" 2>&1 | quiet
done
