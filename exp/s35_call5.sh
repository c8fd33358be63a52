# Session 35, call 5 (nvidia-h200-x2): the ring and multi-GPU tests with auto's per-mode choice, then the public
# op at auto beside cuDNN and Mosaic GPU steps and one-GPU cuDNN flash attention, at 16 and 4 KV heads.
. exp/s28_env.sh
gpu_tests 200 tests/test_ring_attention.py tests/test_multi_gpu.py
ring() { timeout "$1" python3 exp/s33_ring.py --out "$OUT" "${@:2}" 2>&1 | quiet ; }
echo "#### kv heads 16"; ring 150 --platforms auto,cuda,pallas --flash cuda --tag _s35c5
echo "#### kv heads 4"; ring 150 --platforms auto,cuda,pallas --flash cuda --kv-heads 4 --tag _s35c5
