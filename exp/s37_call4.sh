# Session 37, call 4 (nvidia-h200): the GPU tests of what shares the Mosaic GPU flash forward that gained `prior`
# (flash attention, float8, block-sparse) and the ring's on one GPU.
. exp/s28_env.sh
gpu_tests 420 tests/flash_attention/test_gpu.py tests/flash_attention/test_float8.py \
    tests/sparse_attention/test_blocksparse_mosaic_gpu.py tests/test_ring_attention.py
