# Session 39, call 5 (nvidia-h200): where the MXFP4 grouped matmul's time goes: the kernel with its decoding, its
# wgmmas or both removed (exp/s39_mxfp4_parts.py), beside our bf16 grouped matmul.
. exp/s28_env.sh
timeout 400 python3 exp/s39_mxfp4_parts.py --out "$OUT" 2>&1 | quiet
