# Prepared in session 46, not run: issue 44's gated-delta-rule decode step (0.78-0.80 of copy; target 0.8) with qᵀh
# and kᵀh as one float32 dot of a 16-row tile (rows q and k) in place of two reductions across the warps that hold
# the state tile's rows (`exp/s46_gdr_dot.patch`, one file). Times the op's decode batch on main's kernel, then
# patched (each in its own process with its own copy; exp/s38_gdr_decode.py), then the patched kernel's GPU tests. Land
# it only if faster and the tests pass. Run `OUT=$OUT bash exp/s46_next_gdr_dot.sh` (carry `.whl`).
. exp/s28_env.sh
for version in main dot; do
    [ $version = dot ] && patch -p1 < exp/s46_gdr_dot.patch > /dev/null
    echo "=== $version"
    timeout 120 python3 exp/s38_gdr_decode.py --out /tmp/$version 2>&1 | quiet | tail -6
done
gpu_tests 150 tests/linear_attention/test_ragged_gated_delta_rule_triton.py
