# Session 55, call 7 (carry `.whl`; about 2 minutes on an H200). Issue 44: 16-bit pools with 128-column items, landed:
# the Mosaic GPU decode step's GPU tests, and its decode batch on float32 and bf16 pools beside Triton's.
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_ragged_gated_delta_rule_mosaic_gpu.py" TEST_TIMEOUT=100 WORKERS=5 \
    bash tools/gpu-suite 2>&1 | tail -8
(cd exp && timeout 100 python3 s55_pools.py 2>&1 | quiet | tee "$OUT/pools.txt" | tail -8)
