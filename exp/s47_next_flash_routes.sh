# Prepared in session 47, not run: where `auto` should send flash attention calls that no tuned table holds.
# The shipped tables hold 8 anchor signatures a GPU (H 16 or 32, no grouped queries); in every head-dim-128 forward
# among them the Mosaic GPU kernel won, yet a forward off the table goes to cuDNN first (`auto`'s order), and since
# session 47 a windowed call to the Mosaic GPU kernels. This times off-table shapes, grouped-query ones as Llama-3
# 8B / 70B and Mistral run them, beside cuDNN: if the Mosaic GPU forward leads at every head-dim-128 row, extend
# `FlashAttention.heuristic_cfg` to head-dim-128 forwards; if cuDNN leads some windowed GQA rows, narrow it.
# Run `OUT=$OUT bash exp/s47_next_flash_routes.sh` (carry `.whl`), about 6 minutes.
only="--only ejkernel-auto,ejkernel-pallas,ejkernel-triton,jax-cudnn --repeats 10"
OUT=$OUT SKIP_TESTS=1 BENCH_TIMEOUT=330 bash tools/gpu-suite "flash_attention --shape 4,4096,32,128,8 \
    --shape 1,8192,64,128,8 --shape 16,1024,32,128,8 --shape 2,4096,16,128 $only" 2>&1 | tail -24 | tee "$OUT/gqa.txt"
OUT=$OUT SKIP_TESTS=1 BENCH_TIMEOUT=200 bash tools/gpu-suite "flash_attention --window 4096,0 \
    --shape 2,16384,32,128,8 $only" 2>&1 | tail -8 | tee "$OUT/gqa_window.txt"
