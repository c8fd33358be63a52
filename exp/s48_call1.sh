# Session 48, call 1: the float8 forward with P as P·V's register operand (`p_in_registers`) beside the
# shared-memory P (the default), our bf16 forward and cuDNN's, then the float8 GPU tests (the new variants too).
. exp/s28_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
only="ov bk128 s2 r,ov-turns bk128 s2 r,ov-free bk128 s2 r,ov bk128 s3 r,ov bk128 s4 r,ov bk64 s4 r,ov bk128 s2 e32 r"
only="$only,pp bk128 s2 r,ov bk128 s2 e32"
timeout 330 python3 exp/s30_fp8_variants.py --shape 2,8192,16,128 --shape 1,16384,16,128 --only "$only" \
    --repeats 10 --stall 120 2>&1 | quiet | tee "$OUT/fp8_variants.txt" | tail -60
gpu_tests 200 tests/flash_attention/test_float8.py
