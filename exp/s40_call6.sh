# Session 40, call 6 (nvidia-h200): call 5 again after the fix of the transposed output store (relaid out to
# WGMMA_TRANSPOSED, so that float32 outputs store too): the MXFP4 GPU tests and the time at the MoE shape.
. exp/s28_env.sh
gpu_tests 300 tests/grouped_matmul/test_grouped_matmul_mosaic_mxfp4.py
timeout 120 python3 exp/s39_mxfp4.py --out "$OUT" --tiles 256x4 2>&1 | quiet
