#!/usr/bin/env bash
# Thirtieth session: causal_conv1d's sliding-window Triton forward (issue 44): its GPU tests (every forward design
# against XLA), then the sweep of designs and tiles beside XLA and a device copy, then the op's benchmark.
set -u
. exp/s28_env.sh
gpu_tests 150 tests/test_causal_conv1d_triton.py
echo "=== conv variants"
(cd exp && timeout 300 python3 s30_conv_variants.py 2>&1 | quiet | tail -80)
echo "=== bench"
timeout 120 python3 -m ejkernel.cli bench causal_conv1d --out "$OUT" 2>&1 | quiet | tail -14
