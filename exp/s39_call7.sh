# Session 39, call 7 (nvidia-h200): the MXFP4 grouped matmul decoding through two byte tables (prmt) in place of
# shifted bits: the GPU tests of the Mosaic GPU MXFP4 path and of the quantized grouped matmul, its accuracy and
# time at the MoE shape beside bf16 and today's Triton path, and the parts with the shifted decoding beside it.
# (Its harnesses exp/s39_mxfp4_parts.py / s39_mxfp4_shifts.py were removed in session 40 with the kernel they took apart: git show 790bed9:exp/s39_mxfp4_parts.py.)
. exp/s28_env.sh
gpu_tests 150 tests/grouped_matmul/test_grouped_matmul_mosaic_mxfp4.py tests/grouped_matmul/test_grouped_matmul_quantized.py
timeout 120 python3 exp/s39_mxfp4.py --out "$OUT" --tiles 128x256x3 2>&1 | quiet
timeout 180 python3 exp/s39_mxfp4_parts.py --out "$OUT" 2>&1 | quiet
