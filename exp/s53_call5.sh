# Session 53, call 5 (issue 42): with the scale now inside the exponent (call 3), do the float8 forward's row sums on
# the tensor cores pay (call 2, before it: within noise)? `exp/s53_fp8_row_sums_fs.patch` applied on the device.
. exp/s28_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git apply exp/s53_fp8_row_sums_fs.patch
(cd exp && timeout 200 python3 s30_fp8_variants.py --shape 1,16384,16,128 --repeats 10 \
    --only "ov-free bk128 s2,ov-free bk128 s2 tc,ov-free bk128 s2 e16 tc,pp bk128 s2,pp bk128 s2 tc" 2>&1 | quiet \
    | tee "$OUT/fp8_row_sums_fs.txt" | grep -v compiling | grep ms)
