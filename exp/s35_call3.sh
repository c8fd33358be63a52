# Session 35, call 3 (nvidia-h200-x2): HEAD's compiled ring (fwd+bwd, 4 and 16 KV heads) to read which transfer XLA
# places inside the backward's last step at 4 KV heads; and the last step's pairs reordered (exp/s35_ring_last.py).
. exp/s28_env.sh
mkdir -p /tmp/sched
RING=src/ejkernel/kernels/_common/ring.py
vers=head=$RING,last=exp/s35_ring_last.py
for kv in 4 16; do
  echo "#### kv $kv"; timeout 120 python3 exp/s35_ring_bisect.py --versions $vers --kv-heads $kv --modes fwd+bwd --hlo head --out /tmp/sched 2>&1 | quiet | tail -4
done
tar czf "$OUT/sched.tgz" -C /tmp sched
