# Session 41, call 7 (nvidia-h200): ptxas's report on the 4-bit kernel in both formats (spills, C7513;
# `exp/s41_ptxas_gmm.py`, first, in a fresh process), then the 4-bit kernel's tiles at the MoE shape, MXFP4 and affine
# int4 (`exp/s39_mxfp4.py`: 256 rows with 4 and 3 stages, 192 rows with 4).
. exp/s28_env.sh
mkdir -p /tmp/mgpu && MOSAIC_GPU_DUMP_TO=/tmp/mgpu MOSAIC_GPU_DUMP_PTXAS=1 \
    timeout 150 python3 exp/s41_ptxas_gmm.py --out "$OUT" 2>&1 | quiet | grep -v "^nvdisasm\|Source Location\|dump.cc" | head -40
rm -rf "$OUT/mxfp4_dump"
for fmt in mxfp4 affine; do
    timeout 150 python3 exp/s39_mxfp4.py --format $fmt --tiles 256x4,256x3,192x4 --out "$OUT" 2>&1 | quiet
done
