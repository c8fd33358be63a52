#!/usr/bin/env bash
# Twenty-seventh session, one call on 2 H200s: (1) ring attention under XLA's latency-hiding scheduler, and
# the ring backward's bf16 trip home against the code before it; where XLA places the ring's transfers;
# (2) issue 41's before/after A/B on one GPU: the flash, linear-attention, serving and grouped-matmul benches
# on the source before the redesign (.before/src, commit af97fc1) and on this tree's src, one after the other.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
BEFORE=$PWD/.before/src AFTER=$PWD/src LHS=--xla_gpu_enable_latency_hiding_scheduler=true
bench() {  # bench <log name> <src> <XLA_FLAGS> <cache> <args...>
    local name=$1 src=$2 flags=$3 cache=$4
    shift 4
    echo "=== $name: $*" | tee -a "$OUT/summary.log"
    XLA_FLAGS=$flags PYTHONPATH=$src:/tmp/site EJKERNEL_PERSISTENT_CACHE_DIR=/tmp/cache-$cache timeout 150 \
        python3 -m ejkernel.cli bench "$@" --out "$OUT/$name" >"$OUT/$name.log" 2>&1
    grep -v Warning "$OUT/$name.log" | tail -6 | tee -a "$OUT/summary.log"
}
ring=(ring_attention --platform cuda --repeats 10)
bench ring_before_kv16 "$BEFORE" "" before "${ring[@]}"
bench ring_after_kv16 "$AFTER" "" after "${ring[@]}"
bench ring_after_lhs_kv16 "$AFTER" "$LHS" after "${ring[@]}"
bench ring_after_lhs_kv4 "$AFTER" "$LHS" after "${ring[@]}" --kv-heads 4
for flags in "" "$LHS"; do
    echo "=== schedule XLA_FLAGS=$flags" >>"$OUT/schedule.txt"
    XLA_FLAGS=$flags PYTHONPATH=$AFTER:/tmp/site timeout 100 python3 exp/ring_schedule.py >>"$OUT/schedule.txt" 2>&1
done
export CUDA_VISIBLE_DEVICES=0
for side in before after; do
    src=$BEFORE
    [ $side = after ] && src=$AFTER
    bench "flash_$side" "$src" "" "$side" flash_attention --shape 2,8192,16,128 --shape 1,32768,16,128 \
        --only ejkernel-auto,jax-cudnn --repeats 10
    bench "linear_$side" "$src" "" "$side" linear_attention --repeats 10
    bench "serving_$side" "$src" "" "$side" serving_attention --batches 64 --contexts 8192 --repeats 10
    bench "grouped_matmul_$side" "$src" "" "$side" grouped_matmul --repeats 10
done
