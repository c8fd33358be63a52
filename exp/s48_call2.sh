# Session 48, call 2: (1) the float8 forward before / after exp/s48_pshift.patch (P's 2^8 taken inside the
# exponent: one multiply a score fewer), each in its own process, twice; (2) ptxas on P in shared memory against
# registers, causal and not (exp/s48_fp8_ptxas.py).
. exp/s28_env.sh
only="ov bk128 s2 r,pp bk128 s2 r"
for version in before after before after; do
    [ $version = after ] && patch -p1 < exp/s48_pshift.patch > /dev/null
    echo "=== $version"
    timeout 100 python3 exp/s30_fp8_variants.py --shape 2,8192,16,128 --only "$only" --repeats 10 --stall 60 2>&1 \
        | quiet | grep -E "TFLOP|failed"
    [ $version = after ] && patch -R -p1 < exp/s48_pshift.patch > /dev/null
done 2>&1 | cut -c1-120 | tee "$OUT/pshift.txt"
mkdir -p /tmp/mgpu && MOSAIC_GPU_DUMP_TO=/tmp/mgpu MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1 \
    timeout 150 python3 exp/s48_fp8_ptxas.py 2>&1 | quiet | tee "$OUT/ptxas.txt" | tail -40
