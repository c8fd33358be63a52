# Session 34, call 3 (nvidia-h200-x2): the ring with dK / dV sent home after the last step (not piece by piece)
# and its pairs in plain order, at 16 and 4 KV heads beside cuDNN flash attention on one GPU; the ring tests.
. exp/s28_env.sh
ring() { timeout "$1" python3 exp/s33_ring.py --out "$OUT" "${@:2}" 2>&1 | quiet ; }
echo "#### kv heads 16"; ring 150 --platforms cuda,pallas,mixed --flash cuda --tag _s34c3
echo "#### kv heads 4"; ring 120 --platforms cuda,pallas,mixed --flash cuda --kv-heads 4 --tag _s34c3
gpu_tests 120 tests/test_ring_attention.py tests/test_multi_gpu.py
