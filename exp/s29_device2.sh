#!/usr/bin/env bash
# Twenty-ninth session, call 3: float8 caches read in float16 dots by the Triton paged core (issue 45): its GPU
# tests, the tiling sweep against bf16 (cache donated, as serving runs it), and the bench script of session 28.
set -u
. exp/s28_env.sh
gpu_tests 120 tests/serving_attention/test_paged_triton.py
echo "=== fp8 sweep"
timeout 120 python3 exp/s29_fp8_sweep.py 2>&1 | quiet | tail -14
echo "=== s28 fp8"
timeout 40 python3 exp/s28_fp8.py 2>&1 | quiet | tail -4
