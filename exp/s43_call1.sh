# Session 43, call 1 (nvidia-h200): the 4-bit grouped matmul's narrow span tails (exp/s43_narrow.py), A/B in MXFP4
# and affine int4, each format in a process of its own; then the kernel's GPU tests.
. exp/s28_env.sh
for fmt in mxfp4 affine; do
    timeout 170 python3 exp/s43_narrow.py --out "$OUT/$fmt" --format $fmt --repeats 20 2>&1 | quiet | tail -6
done
gpu_tests 160 tests/grouped_matmul/test_grouped_matmul_mosaic_four_bit.py
