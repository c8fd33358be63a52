# Session 44, call 3 (nvidia-h200): what the Triton paged core compiles to for bf16, int8 and e4m3 caches
# (exp/s44_ptx.py over every file XLA dumps; call 2 found no *.ptx).
. exp/s28_env.sh
for dtype in bf16 int8 e4m3; do
    XLA_FLAGS="--xla_dump_to=/tmp/dump_$dtype --xla_gpu_dump_llvmir" timeout 120 python3 exp/s44_ptx.py $dtype /tmp/dump_$dtype 2>&1 | quiet | tail -8
    mkdir -p "$OUT/ptx_$dtype" && for f in $(grep -rl "entry ejkernel_paged_attention" /tmp/dump_$dtype); do gzip -c "$f" > "$OUT/ptx_$dtype/$(basename $f).gz"; done
done
ls /tmp/dump_int8 | head -20
