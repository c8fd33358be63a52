#!/usr/bin/env bash
# Twenty-ninth session, call 2: the causal_conv1d GPU tests fixed after call 1, float8 against bf16 v3 decode by
# tiling (issue 45), and the serving bench's prefill-share table at the final two-pass rule (issue 44).
set -u
. exp/s28_env.sh
gpu_tests 90 tests/test_causal_conv1d_triton.py
echo "=== fp8 sweep"
timeout 150 python3 exp/s29_fp8_sweep.py 2>&1 | quiet | tail -22
echo "=== serving bench"
timeout 240 python3 -m ejkernel.cli bench serving_attention --batches 64 --contexts 8192 --out "$OUT" 2>&1 | quiet | tail -45
