# Session 41, call 5 (nvidia-h200): the MXFP4 grouped matmul with its scales streamed as bf16 2^e (no exponent
# arithmetic in the kernel) beside the kernel before it, at the MoE shape and at extreme exponents
# (`exp/s41_mxfp4_scales.py`), then its GPU tests.
. exp/s28_env.sh
timeout 240 python3 exp/s41_mxfp4_scales.py --out "$OUT" 2>&1 | quiet
gpu_tests 240 tests/grouped_matmul/test_grouped_matmul_mosaic_mxfp4.py
# (`exp/s41_mxfp4_scales.py` and its copy of the old module were removed once the kernel became `_four_bit.py`: `git show 0c4acd9:exp/s41_mxfp4_scales.py`.)
