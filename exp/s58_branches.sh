# Prepared in session 58: both of its unmeasured branches on main, each from a copy of its tree carried beside main's
# (one H200; two calls: `bash exp/s58_branches.sh` about 3 minutes, then `bash exp/s58_branches.sh sweep` about 6,
# chained while warm). Before them, on this machine:
#   for b in spans:s58-ragged-spans unroll:s58-state-unroll; do rm -rf .${b%%:*}_tree && mkdir .${b%%:*}_tree &&
#     git archive ${b#*:} src tests tools exp pyproject.toml | tar -x -C .${b%%:*}_tree; done
# with `/.spans_tree/` and `/.unroll_tree/` in .git/info/exclude; carry [".whl", ".spans_tree", ".unroll_tree"].
# 1. `s58-ragged-spans` (the ragged prefill's pass with affine token addresses): GPU tests of the ragged Triton file on
#    its tree, then the prefill (`s57_capped.py`) on main's tree and on the branch's.
# 2. `s58-state-unroll` (the state passes at 1, 2, 4 chunks a loop step): GPU tests of the Triton linear-attention
#    file on its tree; with `sweep`, only `s58_unroll.py` there (GLA, the gated delta rule and Mamba-2).
. exp/s28_env.sh
root=$PWD
if [ "${1:-}" = sweep ]; then
    (cd .unroll_tree/exp && PYTHONPATH=$root/.unroll_tree/src:/tmp/site timeout 420 python3 s58_unroll.py 2>&1 | quiet | tail -14)
    exit
fi
(cd .spans_tree && PYTHONPATH=/tmp/site OUT=$OUT/spans TESTS="tests/linear_attention/test_ragged_gated_delta_rule_triton.py" \
    TEST_TIMEOUT=90 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -2)
for tree in src .spans_tree/src; do
    echo "#### ragged prefill on $tree"
    (cd exp && PYTHONPATH=$root/$tree:/tmp/site timeout 60 python3 s57_capped.py 2>&1 | quiet | tail -2)
done
(cd .unroll_tree && PYTHONPATH=/tmp/site OUT=$OUT/unroll TESTS="tests/linear_attention/test_linear_triton.py" \
    TEST_TIMEOUT=150 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -3)
