# Session 37, call 5 (nvidia-h200-x2): where the 16-KV-head ring's backward exposes 4 ms of transfers (call 3: 60.43
# against 56.40 ms without any): auto's forward+backward with its compiled schedule written, then the same with XLA
# allowed more than one collective in flight at a time.
. exp/s28_env.sh
ring() { timeout "$1" python3 exp/s33_ring.py --out "$OUT" --modes fwd+bwd --platforms auto "${@:2}" 2>&1 | quiet ; }
echo "#### default"; ring 150 --flash cuda --schedules --tag _s37c5
for limit in 2 4; do
  echo "#### parallel_collective_overlap_limit=$limit"
  XLA_FLAGS=--xla_gpu_experimental_parallel_collective_overlap_limit=$limit ring 100 --flash '' --tag _s37c5_l$limit
done
