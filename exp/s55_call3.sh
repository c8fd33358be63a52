# Session 55, call 3 (carry `.whl`; about 6 minutes on an H200). Issue 44: the Mosaic GPU implementation now serves
# request bounds (its decode kernels on the requests' tokens, or Triton's chunked form) and upstream's private GDR
# entries call the public op: the GPU tests of the GDR files and of the float8 forward (its Vᵀ moved into a named
# function), the serving bench; issue 42: the float8 forward's device timeline (Vᵀ's true share).
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_ragged_gated_delta_rule_mosaic_gpu.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py tests/flash_attention/test_float8.py" \
    TEST_TIMEOUT=300 WORKERS=6 bash tools/gpu-suite "linear_attention --part serving --repeats 20" 2>&1 | tail -30
(cd exp && timeout 120 python3 s55_fp8_timeline.py 2>&1 | quiet | tee "$OUT/fp8_timeline.txt" | tail -30)
