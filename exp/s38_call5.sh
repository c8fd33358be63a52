# Session 38, call 5 (nvidia-h200): the Mosaic GPU MLA kernel with tiles of 64 / heads queries below 64 heads: GPU
# tests, then decode at 16, 32 and 128 heads beside Triton, the 16-head tiling sweep and the 16-head mixed batch.
. exp/s28_env.sh
gpu_tests 240 tests/serving_attention/test_mla_mosaic_gpu.py
timeout 300 python3 exp/s38_mla.py --round 2 2>&1 | quiet | tail -20
