# Session 41, call 4 (nvidia-h200): call 3's ptxas report again, its dump folder created first (Mosaic GPU printed
# the dumps to stdout in call 3).
. exp/s28_env.sh
mkdir -p /tmp/mgpu && MOSAIC_GPU_DUMP_TO=/tmp/mgpu MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_SASS=1 \
    timeout 240 python3 exp/s41_ptxas_gmm.py --out "$OUT" 2>&1 | quiet | cut -c1-400 | head -80
ls -la /tmp/mgpu | head -30
