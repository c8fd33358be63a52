# Session 48, call 3: the float8 forward (P's 2^8 now inside the exponent) by where P lives (` r`: registers), the
# schedule, and row sums on the tensor cores (` t`), causal and not, at the bench's three head-dim-128 shapes; then
# the float8 GPU tests (the row-sums variants too).
. exp/s28_env.sh
only="ov-free bk128 s2 r,ov-turns bk128 s2 r,pp bk128 s2 r,ov bk128 s2 r t,ov-turns bk128 s2 r t,pp bk128 s2 r t"
only="$only,ov bk128 s2 t,pp bk128 s2"
timeout 420 python3 exp/s30_fp8_variants.py --shape 2,8192,16,128 --shape 1,16384,16,128 --shape 8,2048,16,128 \
    --only "$only" --repeats 10 --stall 100 2>&1 | quiet | grep -E "TFLOP|failed|device" | cut -c1-125 \
    | tee "$OUT/fp8_variants.txt" | tail -80
gpu_tests 150 tests/flash_attention/test_float8.py
