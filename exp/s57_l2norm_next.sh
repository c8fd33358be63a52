# Prepared in session 57 for a later call, on branch `s57-dense-l2norm` (one H200, about 5 minutes). Before it, on
# this machine: `git checkout s57-dense-l2norm && rm -rf .main_src && mkdir .main_src && git archive main src | tar -x
# -C .main_src`; carry [".whl", ".main_src"].
# The dense gated delta rule with q and k L2-normalised as its kernels load them (the WY kernel and the one-pass
# forward; XLA's two normalisations took 62 + 66 us of 1.07 ms in session 57's call 5):
# 1. GPU tests of the Triton linear-attention file (the one-pass forward with and without the norm in its kernels).
# 2. The serving bench on main's tree and on the branch's in one call (`gated_delta_rule prefill` triton: 1.07 ms).
# 3. Forward+backward at the training shape (the backward now normalises q and k again for its pullback: 6.17 ms).
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_linear_triton.py" TEST_TIMEOUT=150 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -3
for tree in .main_src/src src; do
    echo "#### on $tree"
    (PYTHONPATH=$PWD/$tree:/tmp/site timeout 120 python3 -m ejkernel.cli bench linear_attention --part serving \
        --repeats 20 --out "$OUT/bench_$(echo "$tree" | tr / _)" 2>&1 | quiet | grep -e "prefill" -e copy)
    (cd exp && PYTHONPATH=$PWD/../$tree:/tmp/site timeout 90 python3 s57_training_chunks.py 2>&1 | quiet | tail -3)
done
