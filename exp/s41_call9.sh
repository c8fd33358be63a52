# Session 41, call 9 (nvidia-h200): the bf16 grouped matmul forward on Triton and on Mosaic GPU beside `auto` at three
# MoE shapes (`exp/s41_gmm_forward_route.py`): is `auto`'s forward-only preference for Triton right on an H200?
. exp/s28_env.sh
timeout 130 python3 exp/s41_gmm_forward_route.py --out "$OUT" 2>&1 | quiet
