# Session 57, call 6 (one H200, about 1.5 minutes; carry [".whl"]): the ragged prefill's GPU tests and its time at
# EasyDeL's chunk (64, run as 32 on Triton since this session) beside Triton's own.
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_ragged_gated_delta_rule_triton.py" TEST_TIMEOUT=100 WORKERS=6 \
    bash tools/gpu-suite 2>&1 | tail -2
(cd exp && timeout 60 python3 s57_capped.py 2>&1 | quiet | tail -3)
