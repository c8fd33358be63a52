#!/usr/bin/env bash
# Thirtieth session, call 3: the fixed fp8_lhs GPU test, causal_conv1d's window forward against XLA (sweep), and
# the weight-only quantized matmul's decode variants (row layout, M 16, int8 and int4 with groups of 64).
set -u
. exp/s28_env.sh
gpu_tests 120 tests/grouped_matmul/test_grouped_matmul_quantized.py -k fp8_lhs
echo "=== conv variants"
(cd exp && timeout 200 python3 s30_conv_variants.py --repeats 10 2>&1 | quiet | tail -40)
for mode in int8_g64 int4_g64; do
    echo "=== qmm $mode"
    timeout $(( (575 - SECONDS) / 2 > 60 ? (575 - SECONDS) / 2 : 60 )) python3 exp/s30_qmm_variants.py --modes $mode --layouts row --rows 16 2>&1 | quiet
done
