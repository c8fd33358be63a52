# Session 47, call 5 (nvidia-h200): a windowed shape the shipped table lacks (window (2048, 0), 4 x 4096, H 16,
# D 128), so that `auto` takes the heuristic: the Mosaic GPU kernel for the forward, auto's order for training.
OUT=$OUT SKIP_TESTS=1 BENCH_TIMEOUT=180 bash tools/gpu-suite "flash_attention --window 2048,0 --shape 4,4096,16,128 \
    --repeats 10 --only ejkernel-auto,ejkernel-pallas,jax-cudnn" 2>&1 | tail -12 | tee "$OUT/window.txt"
