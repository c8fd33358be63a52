# Session 42, call 6 (nvidia-h200), run at 0706e31: the 4-bit kernel's step pairs (each wgmma queued behind the
# previous one) and output staged in row halves (a fifth stage), A/B in MXFP4 and affine int4 (exp/s42_pairs.py, removed
# with its flags after this call: `git show 0706e31:exp/s42_pairs.py`), each format in a
# process of its own; then the GPU tests of the kernel as committed (pairs, halves).
. exp/s28_env.sh
for fmt in mxfp4 affine; do
    timeout 170 python3 exp/s42_pairs.py --out "$OUT/$fmt" --format $fmt --repeats 20 2>&1 | quiet | tail -7
done
gpu_tests 160 tests/grouped_matmul/test_grouped_matmul_mosaic_four_bit.py
