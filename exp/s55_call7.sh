# Session 55, call 7 (prepared; refused for want of device time: the next session's first call). Carry `.whl`; about
# 6 minutes on an H200; `.whl` must hold fla-core 0.6.0's wheel too). Issue 44: 16-bit pools in 128-column items,
# landed after call 6 and not yet run in that form: the Mosaic GPU decode step's GPU tests; its decode batch on
# float32 and bf16 pools beside Triton's (`s55_pools.py`); the item-shape variants left (`s55_decode_variants.py`:
# float32 in 128-column items over 2 slots, bf16 over 2 and 6); flash-linear-attention's decode step in the same call
# (`s35_fla_serving.py`, last timed in session 36 at 0.3815 ms from contiguous states). Also Triton's GDR GPU tests
# and the serving bench after the prefill's Triton chunk became 32 by default (its prefill rows: about 1.7 ms).
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_ragged_gated_delta_rule_mosaic_gpu.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py" \
    TEST_TIMEOUT=150 WORKERS=6 bash tools/gpu-suite "linear_attention --part serving --repeats 20" 2>&1 | tail -30
(cd exp && timeout 100 python3 s55_pools.py 2>&1 | quiet | tee "$OUT/pools.txt" | tail -8)
(cd exp && timeout 200 python3 s55_decode_variants.py 2>&1 | quiet | tee "$OUT/decode_variants.txt" | tail -12)
(cd exp && timeout 150 python3 s35_fla_serving.py --out "$OUT" 2>&1 | quiet | tail -8)
