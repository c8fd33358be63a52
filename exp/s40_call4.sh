# Session 40, call 4 (nvidia-h200): the swap-AB MXFP4 grouped matmul with each step's wgmma issued behind the
# previous one's (`l`: `lag`) beside awaiting each (call 3's), the shared-tile kernel and bf16, at the MoE shape; then
# its accuracy at 3001 x 512 x 384 over 7 groups.
# (Ran exp/s40_mxfp4_swap.py at commit 2668027; the trial became _mxfp4.mxfp4_gmm and the file was removed.)
. exp/s28_env.sh
timeout 300 python3 exp/s40_mxfp4_swap.py --out "$OUT" --tiles 256x128x4,256x128x4l,256x128x3l 2>&1 | quiet
timeout 150 python3 exp/s40_mxfp4_swap.py --out "$OUT/small" --shape 3001,512,384,7 --repeats 3 --tiles 256x128x4l,256x128x4 2>&1 | quiet
