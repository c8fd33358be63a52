# Session 41, call 6 (nvidia-h200): the 4-bit grouped matmul forward (`_four_bit.py`: MXFP4 and now affine int4 in
# the swap-AB Mosaic GPU kernel) under its GPU tests (both formats, the MoE shape and a small one), then
# `ejkernel bench grouped_matmul --part quantized` (int4 on `auto` and on Triton beside bf16 and the other formats).
. exp/s28_env.sh
gpu_tests 330 tests/grouped_matmul/test_grouped_matmul_mosaic_four_bit.py
timeout 200 python3 -m ejkernel.cli bench grouped_matmul --part quantized --out "$OUT" 2>&1 | quiet | tail -20
