# Session 41, call 3 (nvidia-h200): what ptxas says of the grouped-matmul forwards at the MoE shape (C7513 serialised
# wgmma, spills; `exp/s41_ptxas_gmm.py`, first, in a fresh process), then the MXFP4 GPU tests on the eight-codes
# decode landed after call 1 (call 2 named a wrong path and ran none).
. exp/s28_env.sh
mkdir -p /tmp/mgpu && MOSAIC_GPU_DUMP_TO=/tmp/mgpu MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_SASS=1 \
    timeout 200 python3 exp/s41_ptxas_gmm.py --out "$OUT" 2>&1 | quiet | cut -c1-400 | head -80
gpu_tests 240 tests/grouped_matmul/test_grouped_matmul_mosaic_mxfp4.py
