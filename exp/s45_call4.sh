# Session 45, call 4 (nvidia-h200): the landed int8 path (int8 caches read by 16-bit queries take an int8 x int8
# logits dot) timed as exp/s44_kv8.py times it, and the GPU tests of the serving and quantization ops.
. exp/s28_env.sh
timeout 120 python3 exp/s44_kv8.py 2>&1 | quiet | tail -3
gpu_tests 330 tests/serving_attention tests/quantization
