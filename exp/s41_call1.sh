# Session 41, call 1 (nvidia-h200): session 40's review refactor of the MXFP4 grouped matmul (code_pairs, the
# interface's K and N checks) under its GPU tests, and the eight-codes-a-PTX-call decode beside it
# (`exp/s40_mxfp4_wide.py`).
. exp/s28_env.sh
gpu_tests 300 tests/grouped_matmul/test_grouped_matmul_mosaic_mxfp4.py
timeout 200 python3 exp/s40_mxfp4_wide.py --out "$OUT" 2>&1 | quiet
# (`exp/s40_mxfp4_wide.py` became `_mxfp4._WORDS_PTX` after this call and was removed: `git show 1ee8137:exp/s40_mxfp4_wide.py`.)
