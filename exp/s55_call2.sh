# Session 55, call 2 (carry `.whl`; about 3 minutes on an H200). Issue 42: the float8 forward's Vᵀ, Pallas-Triton
# transposes in device time beside XLA's and a byte copy, then the fastest in the forward beside XLA's.
. exp/s28_env.sh
(cd exp && timeout 400 python3 s55_vt.py 2>&1 | quiet | tee "$OUT/vt.txt" | tail -60)
