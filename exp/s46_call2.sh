# Session 46, call 2 (nvidia-h200): session 45's exp2 A/B again (call 1's printout scrolled out; its paged GPU tests
# passed on the patched tree, 12), then issue 45's weight-only matmul with affine codes multiplied raw
# (exp/s46_qmm_fold.py, 8 and 4 bits) and the Triton quantized-matmul GPU tests on the folding kernel.
. exp/s28_env.sh
{
    for version in before after; do
        [ $version = after ] && patch -p1 < exp/s45_exp2.patch > /dev/null
        echo "=== exp2 $version"
        timeout 120 python3 exp/s44_kv8.py 2>&1 | quiet | tail -3
    done
    patch -R -p1 < exp/s45_exp2.patch > /dev/null
    timeout 240 python3 exp/s46_qmm_fold.py 8 2>&1 | quiet
    timeout 100 python3 exp/s46_qmm_fold.py 4 2>&1 | quiet
} 2>&1 | tee "$OUT/call2.txt"
gpu_tests 100 tests/quantization/test_quantized_matmul_triton.py
