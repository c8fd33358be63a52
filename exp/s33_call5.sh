# Session 33, call 5 (nvidia-h200, if no two-GPU machine came back): the ring's GPU tests on one GPU after the last
# ring changes (the fold of a first block under a condition, the diagonal's parity), and the four FP8 grouped-matmul
# tests at the MoE shape that call 3's suite did not reach.
. exp/s28_env.sh
gpu_tests 100 tests/test_ring_attention.py tests/flash_attention/test_gpu.py -k "ring or causal"
mv "$OUT/gpu_tests.log" "$OUT/gpu_tests_ring.log"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 timeout 330 python3 -m pytest -v -rfE -m gpu -n 4 -p no:cacheprovider \
  tests/grouped_matmul/test_grouped_matmul_mosaic_fp8.py -k moe_shape > "$OUT/gpu_tests_fp8.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|PASSED" "$OUT/gpu_tests_fp8.log" | cut -c1-200 | tail -12
