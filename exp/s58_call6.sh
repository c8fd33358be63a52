# Prepared in session 58 (its device time ran out before it), on branch `s58-ragged-spans` (one H200, about 2
# minutes). Before it, on this machine: `git checkout s58-ragged-spans && rm -rf .main_src && mkdir .main_src && git
# archive main src | tar -x -C .main_src`; carry [".whl", ".main_src"].
# The ragged prefill's pass with its token addresses and masks affine in the step (`RequestSpans`: four scalars read
# once a program, none inside the sequential loop; session 58's timeline: the pass 540 us against the dense one's 476).
# 1. GPU tests of the ragged Triton file on the branch.
# 2. The prefill's time on main's tree, then the branch's (`s57_capped.py`: chunk 32 and 64 asked for; 0.979-0.997 ms
#    in session 58).
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_ragged_gated_delta_rule_triton.py" TEST_TIMEOUT=90 WORKERS=6 \
    bash tools/gpu-suite 2>&1 | tail -2
for tree in .main_src/src src; do
    echo "#### on $tree"
    (cd exp && PYTHONPATH=$PWD/../$tree:/tmp/site timeout 60 python3 s57_capped.py 2>&1 | quiet | tail -2)
done
