# Session 42, call 2 (nvidia-h200): the MXFP4 kernel's PTX and ptxas report (exp/s41_ptxas_gmm.py, dumps gzipped under
# $OUT/mxfp4_dump), then its on-device profile with more events a warpgroup and CTA 0's three warpgroups on one clock.
. exp/s28_env.sh
mkdir -p /tmp/mgpu
MOSAIC_GPU_DUMP_TO=/tmp/mgpu MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 timeout 240 python3 exp/s41_ptxas_gmm.py \
    --out "$OUT" 2>&1 | quiet | tail -30
timeout 200 python3 exp/s42_profile_gmm.py --out "$OUT" --events 900 --formats mxfp4 2>&1 | quiet | tail -12
