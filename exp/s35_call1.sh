# Session 35, call 1 (nvidia-h200-x2): bisect the 4-KV-head ring's forward+backward regression since ff12ef9 with
# every version in one process (exp/s35_ring_bisect.py), then the ring and multi-GPU tests on HEAD.
. exp/s28_env.sh
V=/tmp/ring_versions; mkdir -p $V
RING=src/ejkernel/kernels/_common/ring.py
git show ff12ef9:$RING > $V/ff12.py
git show 9f745dd:$RING > $V/r9f74.py
cp $RING $V/head.py
python3 - <<'PY'
import pathlib
V = pathlib.Path("/tmp/ring_versions")
head = (V / "head.py").read_text()
start = "        following = lax.ppermute(block, spec.axis_name, ring) if s < n - 1 else None\n        k_cur, v_cur, seg_cur = block\n        step_dk, step_dv"
end = "            arrived = lax.ppermute((step_dk, step_dv), spec.axis_name, ring)\n"
assert head.count(start) == 1 and head.count(end) == 1
early = head.replace(start, start.replace("else None\n", "else None\n        arrived = lax.ppermute(sent, spec.axis_name, ring) if s > 0 else None\n", 1))
early = early.replace(end, "            sent = (step_dk, step_dv)\n")
(V / "early.py").write_text(early)
pairs = "        pairs = _pairs(len(q))\n"
assert head.count(pairs) == 1
diag = "        pairs = sorted(_pairs(len(q)), key=lambda p: p[0] != p[1]) if s == 0 else _pairs(len(q))\n"
(V / "diagfirst.py").write_text(head.replace(pairs, diag))
(V / "both.py").write_text(early.replace(pairs, diag))
PY
vers=ff12=$V/ff12.py,r9f74=$V/r9f74.py,head=$V/head.py,early=$V/early.py,diagfirst=$V/diagfirst.py,both=$V/both.py
echo "#### kv 4"; timeout 200 python3 exp/s35_ring_bisect.py --versions $vers --kv-heads 4 --out "$OUT" 2>&1 | quiet | tail -20
echo "#### kv 16"; timeout 120 python3 exp/s35_ring_bisect.py --versions ff12=$V/ff12.py,head=$V/head.py,both=$V/both.py --kv-heads 16 --modes fwd+bwd --out "$OUT" 2>&1 | quiet | tail -8
# (the ring and multi-GPU tests passed on HEAD in the first try of this call: 18 passed)
