# Session 49, call 1: the float8 forward with P always P·V's register operand (shared-memory P and the row-sums option
# removed): the defaults (`ov-free` without a mask, `pp` causal) and `ov` beside cuDNN bf16 at the bench's three
# head-dim-128 shapes, causal and not; then the float8 GPU tests.
. exp/s28_env.sh
timeout 330 python3 exp/s30_fp8_variants.py --shape 2,8192,16,128 --shape 1,16384,16,128 --shape 8,2048,16,128 \
    --only "ov-free bk128 s2,pp bk128 s2" --repeats 10 --stall 100 2>&1 | quiet | grep -E "TFLOP|failed|device" \
    | cut -c1-125 | tee "$OUT/fp8_variants.txt" | tail -60
gpu_tests 170 tests/flash_attention/test_float8.py
