# Session 44, call 2 (nvidia-h200): the int8 decode's tilings with the new widening (exp/s44_kv8.py --tilings), and
# what the Triton paged core compiles to for bf16, int8 and e4m3 caches (exp/s44_ptx.py, XLA's PTX dumps).
. exp/s28_env.sh
timeout 200 python3 exp/s44_kv8.py --tilings 2>&1 | quiet | tail -10
for dtype in bf16 int8 e4m3; do
    XLA_FLAGS=--xla_dump_to=/tmp/dump_$dtype timeout 120 python3 exp/s44_ptx.py $dtype /tmp/dump_$dtype 2>&1 | quiet | tail -8
    mkdir -p "$OUT/ptx_$dtype" && for f in $(grep -l "entry ejkernel_paged_attention" /tmp/dump_$dtype/*.ptx); do gzip -c "$f" > "$OUT/ptx_$dtype/$(basename $f).gz"; done
done
