# Session 38, call 11 (nvidia-h200): the GDR decode step at narrow tiles of one or two warps.
. exp/s28_env.sh
timeout 200 python3 exp/s38_gdr_decode.py --narrow --out "$OUT" 2>&1 | quiet | tail -12
