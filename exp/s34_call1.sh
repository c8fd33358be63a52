# Session 34, call 1 (nvidia-h200-x2): the ring whose backward holds its keys mirrored again (kept from the
# forward's ring), beside cuDNN flash attention on one GPU; the ring and multi-GPU tests; the FP8 grouped-matmul
# MoE-shape tests (session 33's fence of 256-row spans tiles).
. exp/s28_env.sh
ring() { timeout "$1" python3 exp/s33_ring.py --out "$OUT" "${@:2}" 2>&1 | quiet ; }
echo "#### kv heads 16"; ring 150 --platforms cuda,pallas,mixed --flash cuda --tag _s34
echo "#### kv heads 4"; ring 110 --platforms cuda,pallas,mixed --flash cuda --kv-heads 4 --tag _s34
gpu_tests 120 tests/test_ring_attention.py tests/test_multi_gpu.py
cp "$OUT/gpu_tests.log" "$OUT/gpu_tests_ring.log"
gpu_tests 120 tests/grouped_matmul/test_grouped_matmul_mosaic_fp8.py -k moe_shape
