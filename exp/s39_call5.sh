# Session 39, call 5 (nvidia-h200): where the MXFP4 grouped matmul's time goes: the kernel with its decoding, its
# wgmmas or both removed (exp/s39_mxfp4_parts.py), beside our bf16 grouped matmul.
# (Its harnesses exp/s39_mxfp4_parts.py / s39_mxfp4_shifts.py were removed in session 40 with the kernel they took apart: git show 790bed9:exp/s39_mxfp4_parts.py.)
. exp/s28_env.sh
timeout 400 python3 exp/s39_mxfp4_parts.py --out "$OUT" 2>&1 | quiet
