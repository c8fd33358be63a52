# Prepared in session 47, not run: the Triton paged core with log2(e) folded into the logits' scale where there is no
# soft cap and no bias (exp/s47_log2e.patch), one multiply a row in place of one a logit; session 45 saw each
# elementwise op on the 8-bit decode's `[16, 128]` logits tile move its time by about 0.5%. Times issue 45's decode
# shape before / after / before / after (each in its own process, exp/s44_kv8.py), then the paged kernels' GPU tests
# on the patched tree. Run `OUT=$OUT bash exp/s47_next_log2e.sh` (carry `.whl`); land the patch only if it is faster
# and the tests pass.
. exp/s28_env.sh
for version in before after before after; do
    [ $version = after ] && patch -p1 < exp/s47_log2e.patch > /dev/null
    echo "=== $version"
    timeout 120 python3 exp/s44_kv8.py 2>&1 | quiet | tail -3
    [ $version = after ] && patch -R -p1 < exp/s47_log2e.patch > /dev/null
done 2>&1 | tee "$OUT/log2e.txt"
patch -p1 < exp/s47_log2e.patch > /dev/null
gpu_tests 150 tests/serving_attention/test_paged_kv_scales.py tests/serving_attention/test_paged_triton.py \
    tests/serving_attention/test_cascade_attention.py
