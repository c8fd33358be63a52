# Prepared in session 46, not run (its device time was spent): issue 42's windowed flash attention. The shipped tuned
# tables hold no windowed call, so `auto` tries cuDNN first there, while the Mosaic GPU forward got 1.5x faster on
# windows (session 39) and was never timed against cuDNN on them. This times every implementation beside cuDNN with a
# causal 4096-token window at two anchor shapes, autotuning each call (TUNE=1), and exports the winners
# ($OUT/tuned_flash_attention.json: merge its windowed signatures into src/ejkernel/ops/tuned/NVIDIA_H200.json).
# Run `OUT=$OUT bash exp/s46_next_window.sh` (carry `.whl`).
OUT=$OUT SKIP_TESTS=1 TUNE=1 BENCH_TIMEOUT=520 bash tools/gpu-suite \
    "flash_attention --window 4096,0 --shape 1,16384,16,128 --shape 2,8192,16,128 --repeats 10 \
    --only ejkernel-auto,ejkernel-pallas,ejkernel-triton,ejkernel-cudnn,jax-cudnn" 2>&1 | tail -30
