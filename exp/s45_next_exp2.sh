# Prepared in session 45 and not yet run (the session's device time was spent): the Triton paged core with base-2
# exponentials (exp/s45_exp2.patch: one `ex2.approx` per logit where `jnp.exp` is libdevice's several instructions,
# LOG2E multiplied in after `adjust_logits`, the running max written back in natural units), as the MLA and flash
# kernels already do. The 8-bit decode is bound by the elementwise work on its `[16, 128]` logits tile (session 45), so
# this A/B times it on issue 45's decode shape before and after, then runs the paged kernels' GPU tests on the patched
# tree. Run `OUT=$OUT bash exp/s45_next_exp2.sh` (carry `.whl`); land the patch only if it is faster and the tests pass.
. exp/s28_env.sh
for version in before after; do
    [ $version = after ] && patch -p1 < exp/s45_exp2.patch
    echo "=== $version"
    timeout 120 python3 exp/s44_kv8.py 2>&1 | quiet | tail -3
done
gpu_tests 150 tests/serving_attention/test_paged_kv_scales.py tests/serving_attention/test_paged_triton.py \
    tests/serving_attention/test_cascade_attention.py
