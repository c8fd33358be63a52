# Session 42, call 4 (nvidia-h200), run at 7abee01: the 4-bit kernel with the next step's wgmma queued ahead
# (exp/s42_issue_ahead.py, removed with its flag after call 6: `git show 7abee01:exp/s42_issue_ahead.py`),
# A/B in MXFP4 and affine int4; ptxas on it (serialised wgmma?); its profile in MXFP4 (256 x 3); the GPU tests.
. exp/s28_env.sh
for fmt in mxfp4 affine; do
    timeout 150 python3 exp/s42_issue_ahead.py --out "$OUT/$fmt" --format $fmt --repeats 20 2>&1 | quiet | tail -5
done
mkdir -p /tmp/mgpu
MOSAIC_GPU_DUMP_TO=/tmp/mgpu MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 timeout 150 python3 exp/s41_ptxas_gmm.py \
    --out "$OUT" 2>&1 | quiet | grep -A4 "== mxfp4\|== affine" | grep -v nvdisasm | head -12
timeout 120 python3 exp/s42_profile_gmm.py --out "$OUT" --events 500 --formats mxfp4 --bf16 no 2>&1 | quiet | tail -4
gpu_tests 150 tests/grouped_matmul/test_grouped_matmul_mosaic_four_bit.py
