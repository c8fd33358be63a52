# Prepared in session 57 for the next session's first call (one H200, about 5 minutes; carry [".whl"]; session 57's
# device time ran out before it):
# 1. The ragged prefill's GPU tests, and its time at EasyDeL's chunk (64, run as 32 on Triton since `5d8e4ca`)
#    beside Triton's own (`s57_capped.py`: the same kernels, so the same time is expected).
# 2. fla's `chunk_gla` kernels, forward+backward, beside which ours are known (`s56_gla_parts.py`; session 56's 60 s
#    and session 57's 150 s printed nothing: its Triton autotuning compiles many configs), for issue 42's GLA row.
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_ragged_gated_delta_rule_triton.py" TEST_TIMEOUT=100 WORKERS=6 \
    bash tools/gpu-suite 2>&1 | tail -2
(cd exp && timeout 60 python3 s57_capped.py 2>&1 | quiet | tail -3)
(cd exp && timeout 300 python3 s56_gla_parts.py --fla > "$OUT/gla_parts_fla.txt" 2>&1; tail -30 "$OUT/gla_parts_fla.txt")
