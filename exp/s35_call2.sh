# Session 35, call 2 (nvidia-h200-x2): the ring with keys swapped to the mirrored layout at the differentiated
# forward's entry (exp/s35_ring_swap.py, untracked) beside ff12ef9's and HEAD's, at 4 and 16 KV heads.
. exp/s28_env.sh
V=/tmp/ring_versions; mkdir -p $V /tmp/sched
RING=src/ejkernel/kernels/_common/ring.py
git show ff12ef9:$RING > $V/ff12.py
vers=ff12=$V/ff12.py,head=$RING,swap=exp/s35_ring_swap.py
echo "#### kv 4"; timeout 150 python3 exp/s35_ring_bisect.py --versions $vers --kv-heads 4 --out /tmp/sched 2>&1 | quiet | tail -10
echo "#### kv 16"; timeout 150 python3 exp/s35_ring_bisect.py --versions $vers --kv-heads 16 --out /tmp/sched 2>&1 | quiet | tail -10
tar czf "$OUT/sched.tgz" -C /tmp sched
