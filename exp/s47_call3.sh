# Session 47, call 3 (nvidia-h200): exp/s46_qmm_fma.patch again. Call 1 timed int8 transposed 4% faster (M 16 and 64;
# Nsight Compute 32.48 -> 31.10 us) but int4 5% slower and the row layout 1% slower, each in one process; the copy's
# speed moved 9% between those processes. Here: Nsight Compute on int4 and the row layout before and after, the
# timing twice in alternating processes, then the patched Triton quantized and grouped matmul GPU tests.
. exp/s28_env.sh
profile() {  # report name, command...
    local name=$1
    shift
    timeout 120 ncu --clock-control none -k regex:ejkernel_quantized_matmul -c 1 --section SpeedOfLight \
        -o "/tmp/$name" "$@" > /dev/null 2>&1
    echo "=== $name: $(ncu -i "/tmp/$name.ncu-rep" --page details 2>&1 | grep -E "Duration" | tr -s ' ')"
}
for version in before after; do
    [ $version = after ] && patch -p1 < exp/s46_qmm_fma.patch > /dev/null
    BITS=4 profile "int4_col_$version" python3 exp/s46_qmm_step.py col 16 triton best
    profile "int8_row_$version" python3 exp/s46_qmm_step.py row 16 triton best
    profile "int8_col_$version" python3 exp/s46_qmm_step.py col 16 triton best
    [ $version = after ] && patch -R -p1 < exp/s46_qmm_fma.patch > /dev/null
done 2>&1 | tee "$OUT/ncu.txt"
for version in before after before after; do
    [ $version = after ] && patch -p1 < exp/s46_qmm_fma.patch > /dev/null
    echo "=== qmm $version"
    timeout 150 python3 exp/s46_qmm_tiles.py 2>&1 | quiet | grep -E "===|heuristic"
    [ $version = after ] && patch -R -p1 < exp/s46_qmm_fma.patch > /dev/null
done 2>&1 | tee "$OUT/qmm_fma.txt"
patch -p1 < exp/s46_qmm_fma.patch > /dev/null
gpu_tests 200 tests/quantization/test_quantized_matmul_triton.py tests/grouped_matmul/test_grouped_matmul_quantized.py
