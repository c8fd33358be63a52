# Prepared in session 46, not run: issue 44's gated-delta-rule decode step (0.78-0.80 of copy; target 0.8) with qᵀh
# and kᵀh as one float32 dot of a 16-row tile (rows q and k) in place of two reductions across the warps that hold
# the state tile's rows (branch `s46-gdr-dot`, one file). Times the op's decode batch on main's kernel, then on the
# branch's (each in its own process with its own copy; exp/s38_gdr_decode.py), then the branch's GPU tests. Land it
# only if faster and the tests pass. Run `OUT=$OUT bash exp/s46_next_gdr_dot.sh` (carry `.whl`; the branch's file is
# checked out into the tree, so run it from a checkout that has the branch).
. exp/s28_env.sh
FILE=src/ejkernel/kernels/_triton/ragged_gated_delta_rule/_decode.py
for version in main s46-gdr-dot; do
    [ $version = s46-gdr-dot ] && git show s46-gdr-dot:$FILE > $FILE
    echo "=== $version"
    timeout 120 python3 exp/s38_gdr_decode.py --out /tmp/$version 2>&1 | quiet | tail -6
done
gpu_tests 150 tests/linear_attention/test_ragged_gated_delta_rule_triton.py
git checkout -- $FILE
