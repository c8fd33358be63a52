# Session 37, call 3 (nvidia-h200-x2): the ring and multi-GPU tests after the restructure (bbe2b81: the Mosaic GPU
# ring trains with cuDNN's backward and comes first in auto's order), then forward+backward at 16 KV heads: auto,
# the cuDNN ring, auto without transfers and with its float32 transfers sent as bf16; and `ejkernel bench` rows.
. exp/s28_env.sh
gpu_tests 150 tests/test_ring_attention.py tests/test_multi_gpu.py
ring() { timeout "$1" python3 exp/s33_ring.py --out "$OUT" "${@:2}" 2>&1 | quiet ; }
echo "#### kv heads 16"; ring 200 --modes fwd+bwd --platforms auto,cuda --nocomm --bf16t --flash cuda --tag _s37c3
echo "#### kv heads 4"; ring 150 --modes fwd,fwd+bwd --platforms auto --flash cuda --kv-heads 4 --tag _s37c3
