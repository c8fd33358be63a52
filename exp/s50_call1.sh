# Session 50, call 1: session 47's two prepared runs. (1) `auto`'s routes for grouped-query flash attention off the
# tuned tables (the run of exp/s47_next_flash_routes.sh whose four-field `--shape` the bench refused in session 49,
# now parsed), forward and forward+backward beside cuDNN; (2) the log2(e)-in-the-scale patch of the Triton paged
# core A/B on issue 45's 8-bit decode shape, then the paged GPU tests on the patched tree.
# Run `OUT=$OUT bash exp/s50_call1.sh` (carry `.whl`), about 8 minutes.
. exp/s28_env.sh
only="--only ejkernel-auto,ejkernel-pallas,ejkernel-triton,jax-cudnn --repeats 10"
OUT=$OUT SKIP_TESTS=1 BENCH_TIMEOUT=300 bash tools/gpu-suite "flash_attention --shape 4,4096,32,128,8 \
    --shape 1,8192,64,128,8 --shape 16,1024,32,128,8 --shape 2,4096,16,128 $only" > "$OUT/gqa_full.txt" 2>&1
tail -24 "$OUT/gqa_full.txt"
for version in before after before after; do
    [ $version = after ] && patch -p1 < exp/s47_log2e.patch > /dev/null
    echo "=== $version"
    timeout 100 python3 exp/s44_kv8.py 2>&1 | quiet | tail -3
    [ $version = after ] && patch -R -p1 < exp/s47_log2e.patch > /dev/null
done 2>&1 | tee "$OUT/log2e.txt"
patch -p1 < exp/s47_log2e.patch > /dev/null
gpu_tests 100 tests/serving_attention/test_paged_kv_scales.py tests/serving_attention/test_paged_triton.py \
    tests/serving_attention/test_cascade_attention.py
