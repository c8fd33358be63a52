# Session 51, call 6: `auto` on the head-dim-64 routes of `60f6574` (Triton forward, Mosaic GPU training), the
# flash attention GPU tests of test_gpu.py, and the one FP8 grouped-matmul test left unrun since session 50.
. exp/s28_env.sh
OUT=$OUT SKIP_TESTS=1 BENCH_TIMEOUT=120 bash tools/gpu-suite "flash_attention --shape 16,1024,32,64,8 \
    --only ejkernel-auto,jax-cudnn --repeats 10" > "$OUT/auto_d64.txt" 2>&1
tail -6 "$OUT/auto_d64.txt"
OUT=$OUT TESTS="tests/flash_attention/test_gpu.py
 tests/grouped_matmul/test_grouped_matmul_mosaic_fp8.py::test_gpu_matches_xla_at_the_moe_shape" \
    TEST_TIMEOUT=200 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -6
