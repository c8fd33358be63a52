# Session 36, call 5 (nvidia-h200): the quantized-weight grouped matmul's Triton forward swept over tiles, with and
# without `swap_ab` (exp/s36_qgmm.py; issue 45 asks MXFP4 >= 1.0x and FP8 block-scaled >= 1.4x our bf16), then the
# Triton grouped-matmul GPU tests.
. exp/s28_env.sh
timeout 420 python3 exp/s36_qgmm.py --out "$OUT" 2>&1 | quiet | tail -40
gpu_tests 120 tests/grouped_matmul/test_grouped_matmul_quantized.py
