#!/usr/bin/env bash
# Twenty-eighth session, last call (three minutes of device time left): the GPU tests the executor's check-once
# change and Triton's return_lse touch (flash attention and linear attention on Triton), and float8 v3 decode.
set -u
. exp/s28_env.sh
gpu_tests 85 tests/flash_attention/test_triton.py tests/linear_attention/test_linear_triton.py
echo "=== fp8"
timeout 35 python3 exp/s28_fp8.py 2>&1 | quiet | tail -5
