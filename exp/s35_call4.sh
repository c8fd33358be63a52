# Session 35, call 4 (nvidia-h200-x2): the backward's gradients leave each step together (an optimization barrier)
# beside ff12ef9's ring and HEAD's, then the full table (cuDNN, Mosaic GPU and mixed steps beside one-GPU cuDNN).
. exp/s28_env.sh
V=/tmp/ring_versions; mkdir -p $V
RING=src/ejkernel/kernels/_common/ring.py
git show ff12ef9:$RING > $V/ff12.py; git show HEAD:$RING > $V/head.py
vers=ff12=$V/ff12.py,head=$V/head.py,barrier=$RING
for kv in 4 16; do
  echo "#### bisect kv $kv"; timeout 120 python3 exp/s35_ring_bisect.py --versions $vers --kv-heads $kv --out /tmp/sched 2>&1 | quiet | tail -8
done
ring() { timeout "$1" python3 exp/s33_ring.py --out "$OUT" "${@:2}" 2>&1 | quiet ; }
echo "#### kv heads 16"; ring 150 --platforms cuda,pallas,mixed --flash cuda --tag _s35c4
echo "#### kv heads 4"; ring 150 --platforms cuda,pallas,mixed --flash cuda --kv-heads 4 --tag _s35c4
