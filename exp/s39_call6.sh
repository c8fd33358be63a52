# Session 39, call 6 (nvidia-h200): the MXFP4 grouped matmul decoding 64 weight rows at a time (half the live
# registers of call 4's whole-half decode): three tilings beside bf16 and today's path, then the parts again.
# (Its harnesses exp/s39_mxfp4_parts.py / s39_mxfp4_shifts.py were removed in session 40 with the kernel they took apart: git show 790bed9:exp/s39_mxfp4_parts.py.)
. exp/s28_env.sh
timeout 300 python3 exp/s39_mxfp4.py --out "$OUT" --tiles 128x256x3,128x128x4,128x128x5 2>&1 | quiet
timeout 240 python3 exp/s39_mxfp4_parts.py --out "$OUT" 2>&1 | quiet
