# Session 58, call 6 (one H200, about 90 s; carry [".whl"]): the ragged prefill's pass with its token addresses and
# masks affine in the step (`RequestSpans`: four scalars read once a program, none inside the sequential loop).
# GPU tests of the ragged Triton file, then the prefill's time (`s57_capped.py`: chunk 32 and 64 asked for; 0.979-0.997
# ms before, in calls 1, 2 and 5).
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_ragged_gated_delta_rule_triton.py" TEST_TIMEOUT=90 WORKERS=6 \
    bash tools/gpu-suite 2>&1 | tail -2
(cd exp && timeout 60 python3 s57_capped.py 2>&1 | quiet | tail -3)
