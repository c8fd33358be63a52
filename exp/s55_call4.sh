# Session 55, call 4 (carry `.whl`; about 5 minutes on an H200). Issue 44: the Mosaic GPU decode step on 16-bit pools
# and request bounds (call 3's mixed-bounds test now in bf16): the GDR GPU tests, the serving bench (a decode batch on
# a bf16 pool now beside the float32 rows), and device timelines of the decode step with and without bounds.
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_ragged_gated_delta_rule_mosaic_gpu.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py tests/linear_attention/test_ragged_gated_delta_rule.py" \
    TEST_TIMEOUT=240 WORKERS=6 bash tools/gpu-suite "linear_attention --part serving --repeats 20" 2>&1 | tail -30
(cd exp && timeout 150 python3 s55_gdr_timeline.py 2>&1 | quiet | tee "$OUT/gdr_timeline.txt" | tail -60)
