# Session 40, call 3 (nvidia-h200): the MXFP4 grouped matmul with the decoded weights as wgmma's A operand in
# registers (`exp/s40_mxfp4_swap.py`) at the MoE shape, beside the shared-tile kernel (256 x 128 x 3) and bf16.
# (Ran exp/s40_mxfp4_swap.py at commit 2668027; the trial became _mxfp4.mxfp4_gmm and the file was removed.)
. exp/s28_env.sh
timeout 400 python3 exp/s40_mxfp4_swap.py --out "$OUT" --tiles 256x128x4,256x128x3,128x128x4 2>&1 | quiet
