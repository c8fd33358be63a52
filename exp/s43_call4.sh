# Session 43, call 4 (nvidia-h200): the 4-bit grouped matmul's GPU tests on the reviewed kernel (4fec1d6: the output
# store without its unreachable narrower-staging branch).
. exp/s28_env.sh
gpu_tests 200 tests/grouped_matmul/test_grouped_matmul_mosaic_four_bit.py
