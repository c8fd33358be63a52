# Session 38, call 8 (nvidia-h200): the GDR decode's writers looping over heads (Triton's pipeline stages), and
# `ejkernel bench mla --cases paged` with its 16-head decode row.
. exp/s28_env.sh
timeout 200 python3 exp/s38_gdr_decode.py --looped --out "$OUT" 2>&1 | quiet | tail -12
timeout 240 python3 -m ejkernel.cli bench mla --cases paged --repeats 20 --out "$OUT" 2>&1 | quiet | tail -12
