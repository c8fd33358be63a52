# Session 33, call 2 (nvidia-h200-x2): the ring before / after keeping keys and values in place, and with XLA's
# overlap limit raised; then the ring and multi-GPU tests on the new ring.
. exp/s28_env.sh
[ -s exp/s33_ring_before.py ] || git show ff12ef9:src/ejkernel/kernels/_common/ring.py > exp/s33_ring_before.py  # (make it here first: the device copy's git may lack ff12ef9)
mkdir -p /tmp/before && cp -r src /tmp/before/ && cp exp/s33_ring_before.py /tmp/before/src/ejkernel/kernels/_common/ring.py
ring() { timeout "$1" python3 exp/s33_ring.py --out "$OUT" "${@:2}" 2>&1 | quiet ; }
echo "#### before"; PYTHONPATH=/tmp/before/src:/tmp/site ring 90 --flash "" --tag _before
echo "#### after"; ring 120 --platforms cuda,pallas,mixed --flash "cuda,pallas" --tag _after
for lim in 2; do
  echo "#### after, overlap limit $lim"
  XLA_FLAGS=--xla_gpu_experimental_parallel_collective_overlap_limit=$lim ring 80 --flash "" --tag _after_lim$lim
done
echo "#### after, kv heads 4"; ring 70 --flash "cuda" --kv-heads 4 --tag _after
grep -h "" "$OUT"/s33_ring_kv16_after.json | tr -d '\n ' ; echo
gpu_tests 120 tests/test_ring_attention.py tests/test_multi_gpu.py
