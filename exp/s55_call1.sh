# Session 55, call 1 (carry `.whl`; about 6 minutes on an H200). Issue 44: the packaged Mosaic GPU decode step (landed
# on main as 2669f8a, not yet run on a GPU): its GPU tests beside Triton's, the serving bench (auto now routes to it),
# the session-54 prototype in the same run (0.840 of copy then), and device timelines of both steps.
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_ragged_gated_delta_rule_mosaic_gpu.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py" \
    TEST_TIMEOUT=200 WORKERS=4 bash tools/gpu-suite "linear_attention --part serving --repeats 20" 2>&1 | tail -30
(cd exp && timeout 120 python3 s54_gdr_mosaic.py 2>&1 | quiet | tee "$OUT/gdr_prototype.txt" | tail -8)
(cd exp && timeout 120 python3 s55_gdr_timeline.py 2>&1 | quiet | tee "$OUT/gdr_timeline.txt" | tail -60)
