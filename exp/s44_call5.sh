# Session 44, call 5 (nvidia-h200): the MLIR files XLA dumps for the Triton paged core on bf16 and e4m3 caches
# (exp/s44_ptx.py compiles the decode step with the dumps on), copied gzipped to $OUT, to see whether the 8-bit
# kernel's loads are pipelined (asynchronous copies) as bf16's.
. exp/s28_env.sh
for dtype in bf16 e4m3; do
    XLA_FLAGS="--xla_dump_to=/tmp/dump_$dtype" timeout 120 python3 exp/s44_ptx.py $dtype /tmp/dump_$dtype 2>&1 | quiet | tail -2
    mkdir -p "$OUT/mlir_$dtype"
    for f in $(grep -rl "ejkernel_paged_attention" /tmp/dump_$dtype --include=*.mlir); do
        ls -la "$f"; gzip -c "$f" > "$OUT/mlir_$dtype/$(basename $f).gz"
    done
done
