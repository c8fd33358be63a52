# Session 37, call 1 (nvidia-h200-x2): the ring and multi-GPU tests (the Mosaic GPU steps now merge in the kernel;
# `auto` prefers a platform since session 36), then the ring at 16 and 4 KV heads: auto, cuDNN steps, Mosaic GPU
# steps merging in the kernel and in XLA, and the Mosaic forward + cuDNN backward both ways, beside one GPU's cuDNN.
. exp/s28_env.sh
gpu_tests 190 tests/test_ring_attention.py tests/test_multi_gpu.py
ring() { timeout "$1" python3 exp/s33_ring.py --out "$OUT" "${@:2}" 2>&1 | quiet ; }
variants=auto,cuda,pallas,pallas-merged,mixed,mixed-merged
echo "#### kv heads 16"; ring 180 --platforms $variants --flash cuda --tag _s37c1
echo "#### kv heads 4"; ring 180 --platforms $variants --flash cuda --kv-heads 4 --tag _s37c1
