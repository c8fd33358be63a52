# Session 40, call 2 (nvidia-h200): the MXFP4 grouped matmul at the MoE shape in 256 x 128 tiles with the output
# tile stored in 64-column pieces (`store_cols`), which frees room for a fourth ring slot, beside 128-column pieces,
# 128 x 256 tiles, bf16 and `auto`.
# Ran on commit 900269c (store_cols and the harness's `s<cols>`), reverted after it: the pieces gained nothing.
. exp/s28_env.sh
timeout 300 python3 exp/s39_mxfp4.py --out "$OUT" --tiles 256x128x3,256x128x3s64,256x128x4s64,128x256x3s64,128x256x4s64 2>&1 | quiet
