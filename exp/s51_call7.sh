# Session 51, call 7: the fused Mosaic GPU backward at head dim 128 with dQ shared between the warpgroups
# (exp/s51_fused_bwd.py; prototype switches, off by default).
. exp/s28_env.sh
cd exp && PYTHONPATH=../src:/tmp/site timeout 200 python3 s51_fused_bwd.py 2>&1 | tee "$OUT/fused_bwd.txt" | grep -v Warn | tail -16
