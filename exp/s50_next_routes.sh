# Prepared in session 50, not run: the flash attention routes the heuristic does not cover yet. Head dim 64 (the
# heuristic sends only head-dim-128 calls to the Mosaic GPU kernels; the tables' 8 x 2048 x 32 x 64 rows went to
# Triton forward and split training), and causal training at 4096-8192 keys (the Mosaic GPU pair led cuDNN by 1.04 at
# 2 x 4096 and 4 x 4096 causal in session 50's calls 1 and 3, and trailed at 1 x 8192 x 64 heads, 0.88). If a row's
# winner differs from `auto ran`, extend `FlashAttention.heuristic_cfg` with that measurement.
# Run `OUT=$OUT bash exp/s50_next_routes.sh` (carry `.whl`), about 5 minutes.
only="--only ejkernel-auto,ejkernel-pallas,ejkernel-triton,jax-cudnn --repeats 10"
OUT=$OUT SKIP_TESTS=1 BENCH_TIMEOUT=300 bash tools/gpu-suite "flash_attention --shape 16,1024,32,64,8 \
    --shape 4,4096,32,64,8 --shape 2,8192,32,128,8 --shape 1,8192,32,128,8 $only" > "$OUT/routes.txt" 2>&1
tail -18 "$OUT/routes.txt"
