# Session 38, call 6 (nvidia-h200): the 8-bit v3 decode's Triton tiling swept (scale loads before the first dot),
# and the GDR decode beside what its memory traffic alone costs (a tile copy in place, XLA's gather + scatter).
. exp/s28_env.sh
timeout 240 python3 exp/s38_kv8.py 2>&1 | quiet | tail -14
timeout 200 python3 exp/s38_gdr_decode.py --ceiling --out "$OUT" 2>&1 | quiet | tail -10
