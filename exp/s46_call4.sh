# Session 46, call 4 (nvidia-h200): what call 3's GPU suite did not reach (cut at 430 s) and the test that failed there
# (exp/s46_gpu_rest.txt; its traceback: CUDA_ERROR_OUT_OF_MEMORY instantiating a CUDA graph beside five workers),
# at tools/gpu-suite's new 0.8 of the GPU's memory over the workers; then the Triton quantized-matmul tests on the
# new transposed-layout tiles.
. exp/s28_env.sh
mapfile -t rest < exp/s46_gpu_rest.txt
OUT=$OUT TESTS="${rest[*]} tests/quantization/test_quantized_matmul_triton.py" TEST_TIMEOUT=420 WORKERS=6 \
    bash tools/gpu-suite 2>&1 | tail -25
