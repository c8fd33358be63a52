# Session 43, call 3 (nvidia-h200): call 2's GPU suite ran out of time at 93%. Its two failures again, alone, with
# their tracebacks; then the 16 GPU tests it had not reached (exp/s43_gpu_rest.txt).
. exp/s28_env.sh
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 timeout 200 python3 -m pytest -q -rfE -m gpu -n 2 -p no:cacheprovider \
    "tests/state_space/test_ssm_triton.py::test_gpu_v2_triton_matches_xla[2-float32-cfg2]" \
    "tests/grouped_matmul/test_grouped_matmul_mosaic_fp8.py::test_gpu_matches_xla_at_the_moe_shape[None-True]" \
    2>&1 | tee "$OUT/failed_again.log" | grep -E "Error|error|assert|FAILED|passed|failed|Mismatch|max" | cut -c1-400 | tail -30
mapfile -t rest < exp/s43_gpu_rest.txt
gpu_tests 280 "${rest[@]}"
