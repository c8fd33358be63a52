# Session 40, call 7 (nvidia-h200): the MXFP4 grouped matmul with the codes' signs set in the table's high bytes
# (12 PTX instructions a register in place of 16): its GPU tests, and its time at the MoE shape beside session 39's
# PTX and bf16 (`exp/s40_mxfp4_signs.py`).
. exp/s28_env.sh
gpu_tests 200 tests/grouped_matmul/test_grouped_matmul_mosaic_mxfp4.py
timeout 110 python3 exp/s40_mxfp4_signs.py --out "$OUT" 2>&1 | quiet
# (`exp/s40_mxfp4_signs.py` was removed in session 41, when the eight-codes decode replaced the PTX it patched: `git show 1ee8137:exp/s40_mxfp4_signs.py`.)
