# Session 42, call 7 (nvidia-h200): the 4-bit kernel's GPU tests as committed (steps in pairs, output in row halves,
# 5 stages by default).
. exp/s28_env.sh
gpu_tests 170 tests/grouped_matmul/test_grouped_matmul_mosaic_four_bit.py
