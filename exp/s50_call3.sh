# Session 50, call 3: the GPU tests of the other op families whose configs tile a backward (block-sparse attention,
# the linear-attention family, grouped matmul), which now run a call whose two modes select one config without the
# executor's per-mode custom VJP; then `auto`'s flash attention routes by the heuristic as refined after call 2
# (head dim 128: forwards over 1024 keys or more and training over 2048 or fewer to the Mosaic GPU kernels).
# Run `OUT=$OUT bash exp/s50_call3.sh` (carry `.whl`), about 7 minutes.
. exp/s28_env.sh
OUT=$OUT TESTS="tests/sparse_attention tests/linear_attention tests/grouped_matmul" TEST_TIMEOUT=380 WORKERS=6 \
    bash tools/gpu-suite 2>&1 | tail -20
OUT=$OUT SKIP_TESTS=1 BENCH_TIMEOUT=120 bash tools/gpu-suite "flash_attention --shape 8,1024,16,128 \
    --shape 4,4096,32,128,8 --only ejkernel-auto,ejkernel-pallas,jax-cudnn --repeats 10" > "$OUT/routes.txt" 2>&1
tail -10 "$OUT/routes.txt"
