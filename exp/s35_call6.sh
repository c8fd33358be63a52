# Session 35, call 6 (nvidia-h200-x2): the ring's transfers stacked into one per (shape, dtype) (working tree)
# beside HEAD's, Mosaic GPU steps forward and cuDNN steps forward+backward, at 16 and 4 KV heads.
. exp/s28_env.sh
V=/tmp/ring_versions; mkdir -p $V /tmp/sched
RING=src/ejkernel/kernels/_common/ring.py
git show HEAD:$RING > $V/head.py
vers=head=$V/head.py,stacked=$RING
for kv in 16 4; do
  timeout 100 python3 exp/s35_ring_bisect.py --versions $vers --kv-heads $kv --block mosaic --modes fwd --out /tmp/sched 2>&1 | quiet | tail -3
  timeout 100 python3 exp/s35_ring_bisect.py --versions $vers --kv-heads $kv --block cudnn --modes fwd+bwd --out /tmp/sched 2>&1 | quiet | tail -3
done
tar czf "$OUT/sched.tgz" -C /tmp sched
