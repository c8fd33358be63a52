# Session 51, call 2: the GPU tests session 50 did not reach (their test functions: call 1 passed them to pytest as
# node ids, whose spaces split them, and nothing ran), then block-sparse attention beside dense flash attention
# (first H200 run since session 24's H100 one; the Mosaic GPU kernels changed since).
. exp/s28_env.sh
OUT=$OUT TESTS="tests/grouped_matmul/test_grouped_matmul_mosaic_fp8.py::test_gpu_matches_xla_at_the_moe_shape
 tests/grouped_matmul/test_grouped_matmul_mosaic_gpu.py::test_gpu_matches_xla_at_moe_shapes
 tests/grouped_matmul/test_grouped_matmul_mosaic_gpu.py::test_gpu_matches_xla_small_groups_and_layouts
 tests/grouped_matmul/test_grouped_matmul_quantized.py tests/sparse_attention/test_kernels.py" \
    TEST_TIMEOUT=240 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -12
OUT=$OUT SKIP_TESTS=1 BENCH_TIMEOUT=300 bash tools/gpu-suite "sparse_attention --repeats 10" > "$OUT/sparse.txt" 2>&1
tail -22 "$OUT/sparse.txt"
