# Prepared in session 46, not run: issue 45's weight-only matmul with the affine decode's `q·s + o` as one
# `fma.rn.f32` (`exp/s46_qmm_fma.patch`: `_helpers.fma`, inline PTX; the kernels are compiled without contracting
# a multiply and an add, and call 1 of session 46 counted an FMUL and an FADD a weight, 31% of the instructions).
# Times the landed tiles (exp/s46_qmm_tiles.py's heuristic rows) before and after, each in its own process with its
# own copy, then the patched Triton quantized and grouped matmul GPU tests. Land it only if faster and the tests
# pass. Run `OUT=$OUT bash exp/s46_next_qmm_fma.sh` (carry `.whl`).
. exp/s28_env.sh
for version in before after; do
    [ $version = after ] && patch -p1 < exp/s46_qmm_fma.patch > /dev/null
    echo "=== $version"
    timeout 150 python3 exp/s46_qmm_tiles.py 2>&1 | quiet | grep -E "===|heuristic"
done
gpu_tests 200 tests/quantization/test_quantized_matmul_triton.py tests/grouped_matmul/test_grouped_matmul_quantized.py
