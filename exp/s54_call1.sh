# Session 54, call 1 (carry `.whl`): session 53's prepared call (float8 ring depth; every kernel of the block-sparse
# training step) and the float8 forward's share spent in XLA's V transpose.
. exp/s28_env.sh
(cd exp && timeout 120 python3 s54_fp8_parts.py --shape 8,2048,16,128 --shape 2,8192,16,128 2>&1 | quiet \
    | tee "$OUT/fp8_parts.txt" | grep ms)
bash exp/s53_next.sh
