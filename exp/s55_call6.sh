# Session 55, call 6 (carry `.whl`; about 3 minutes on an H200). Issue 44: the Mosaic GPU decode step's variants on
# float32 and bf16 pools (three compute warpgroups, 8 stages, 128 columns an item) beside the landed kernel.
. exp/s28_env.sh
(cd exp && timeout 300 python3 s55_decode_variants.py 2>&1 | quiet | tee "$OUT/decode_variants.txt" | tail -20)
