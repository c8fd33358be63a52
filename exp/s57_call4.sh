# Session 57, call 4 (one H200, about 5 minutes; carry [".whl"]): the gated delta rule at chunk 64 (EasyDeL's).
# 1. GPU tests of the dense and ragged Triton files (the split WY transform, the mixed prefill at chunk 64).
# 2. The serving bench: ragged and dense prefill at Triton's chunk (32) and at 64, the mixed batch.
# 3. Forward+backward at the training shape at chunks 32 and 64, beside GLA (`s57_training_chunks.py`).
# 4. fla's prefill rows in the same call (`s35_fla_serving.py`), unfiltered (call 3 printed none).
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_ragged_gated_delta_rule_triton.py tests/linear_attention/test_linear_triton.py" \
    TEST_TIMEOUT=150 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -4
(timeout 130 python3 -m ejkernel.cli bench linear_attention --part serving --repeats 20 --out "$OUT/bench" 2>&1 \
    | quiet | grep -e prefill -e mixed -e copy)
(cd exp && timeout 90 python3 s57_training_chunks.py 2>&1 | quiet | tail -4)
(cd exp && timeout 100 python3 s35_fla_serving.py --out "$OUT" 2>&1 | quiet | tail -8)
