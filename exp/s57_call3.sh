# Session 57, call 3 (one H200, about 5 minutes; carry [".whl"]): the gated delta rule's one-pass forward as landed.
# 1. GPU tests of the dense and ragged Triton files (the ragged prefill's `_pass_kernel`, the dense `_delta_outputs`).
# 2. The serving bench (ragged prefill at the op's chunk and at 64, a mixed batch, dense prefill) and fla's rows
#    in the same call (`s35_fla_serving.py`: fla's prefill with q and k normalised beforehand and in its call).
# 3. fla's `chunk_gla` kernels, forward+backward (issue 42's GLA row; session 56's 60 s were too few to compile).
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_ragged_gated_delta_rule_triton.py tests/linear_attention/test_linear_triton.py" \
    TEST_TIMEOUT=150 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -4
(timeout 120 python3 -m ejkernel.cli bench linear_attention --part serving --repeats 20 --out "$OUT/bench" 2>&1 \
    | quiet | grep -e prefill -e mixed -e copy)
(cd exp && timeout 80 python3 s35_fla_serving.py --out "$OUT" 2>&1 | quiet | grep prefill)
(cd exp && timeout 150 python3 s56_gla_parts.py --fla 2>&1 | quiet | tee "$OUT/gla_parts_fla.txt" | tail -24)
