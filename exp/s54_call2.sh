# Session 54, call 2 (carry `.whl`; about 5 minutes). The GDR decode writers in Mosaic GPU with one compute
# warpgroup (issue 44); float8 Vᵀ by uint8 XLA and by a Pallas-Triton kernel (issue 42); a timeline of the block-sparse
# step (nsys); then, if time is left, the float8 forward's ring depth (session 53's prepared part).
. exp/s28_env.sh
(cd exp && timeout 150 python3 s54_gdr_mosaic.py 2>&1 | quiet | tee "$OUT/gdr_mosaic.txt" | tail -8)
(cd exp && timeout 120 python3 s54_vt.py 2>&1 | quiet | tee "$OUT/vt.txt" | tail -20)
# The block-sparse step's time outside its kernels (call 1: kernels 1.59 ms of 1.73-1.74 timed): a timeline.
if command -v nsys > /dev/null; then
    XLA_FLAGS="--xla_gpu_autotune_level=0" timeout 120 nsys profile -o "$OUT/sparse_step" --force-overwrite true \
        python3 exp/s52_ncu_step.py sparse > /dev/null 2>&1
    timeout 60 nsys stats --report cuda_gpu_trace --format csv "$OUT/sparse_step.nsys-rep" > "$OUT/sparse_trace.csv" 2>&1
    tail -30 "$OUT/sparse_trace.csv" | cut -c1-200
else
    echo "no nsys"
fi
(cd exp && timeout 150 python3 s30_fp8_variants.py --shape 8,2048,16,128 --repeats 10 \
    --only "ov bk128 s3,pp bk128 s2,pp bk128 s3" 2>&1 | quiet | tee "$OUT/fp8_stages.txt" | grep -v compiling | grep ms)
