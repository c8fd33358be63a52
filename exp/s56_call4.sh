# Session 56, call 4 (one H200, carry `.whl` with fla-core 0.6.0; about 5 minutes). The gated delta rule's forward
# state pass on its own default tiling (128 value columns, 8 warps, 3 stages; dense and ragged): the GPU tests of the
# Triton linear-attention, ragged GDR and SSM files, the serving bench, forward+backward beside GLA
# (`s56_training.py`), fla's rows in the same call.
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_linear_triton.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py tests/state_space/test_ssm_triton.py" \
    TEST_TIMEOUT=120 WORKERS=6 bash tools/gpu-suite "linear_attention --part serving --repeats 20" 2>&1 | tail -24
(cd exp && timeout 110 python3 s56_training.py 2>&1 | quiet | tee "$OUT/training.txt" | tail -6)
(cd exp && timeout 60 python3 s35_fla_serving.py --out "$OUT" 2>&1 | quiet | tail -6)
