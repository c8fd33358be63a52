# Session 54, call 3 (carry `.whl`; about 2 minutes). Issue 42: the float8 Vᵀ's device time (call 2's timings were
# the host's dispatch); a device timeline of the block-sparse step (where its 0.15 ms outside the kernels goes).
. exp/s28_env.sh
(cd exp && timeout 100 python3 s54_vt_device.py 2>&1 | quiet | tee "$OUT/vt_device.txt" | grep us)
(cd exp && timeout 100 python3 s54_timeline.py 2>&1 | quiet | tee "$OUT/sparse_timeline.txt" | tail -40)
