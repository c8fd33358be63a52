# Prepared in session 56 for the next session's first call, on branch `s56-ragged-inplace` (one H200, about 5
# minutes). Before it, on this machine: `git checkout s56-ragged-inplace && rm -rf .main_src && mkdir .main_src &&
# git archive main src | tar -x -C .main_src && echo /.main_src/ >> .git/info/exclude`; carry [".whl", ".main_src"].
# 1. GPU tests of the ragged GDR files (Triton, Mosaic GPU) and the Triton linear-attention file: the kernels that
#    read q, k and v in place (no pack) and the WY transform's shared `wy_blocks`.
# 2. The serving bench on main's tree and on the branch's, in one call (the prefill rows: main 1.37 ms in session 56),
#    and fla's rows (`s35_fla_serving.py`: its prefill with q and k normalised beforehand and in the call).
# 3. The dense forward's outputs made inside the state pass (`s56_fused_pass.py`: e and U never written) beside the
#    landed pass and output kernel, over tilings, at chunks 32 and 64 and on one long sequence.
# The second call is `exp/s56_next2.sh`.
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_ragged_gated_delta_rule_triton.py tests/linear_attention/test_ragged_gated_delta_rule_mosaic_gpu.py tests/linear_attention/test_linear_triton.py" \
    TEST_TIMEOUT=150 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -8
for tree in .main_src/src src; do
    echo "#### serving bench on $tree"
    (PYTHONPATH=$PWD/$tree:/tmp/site timeout 120 python3 -m ejkernel.cli bench linear_attention --part serving \
        --repeats 20 --out "$OUT/bench_$(echo "$tree" | tr / _)" 2>&1 | quiet | grep -e prefill -e mixed -e copy)
done
(cd exp && timeout 80 python3 s35_fla_serving.py --out "$OUT" 2>&1 | quiet | tail -7)
(cd exp && timeout 200 python3 s56_fused_pass.py 2>&1 | quiet | tee "$OUT/fused_pass.txt" | tail -22)
