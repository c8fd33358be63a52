# Prepared in session 46, not run: whether the Triton kernels here contract a multiply and an add into an FFMA at all.
# Session 46's call 1 counted an FMUL and an FADD a weight in the weight-only matmul's decode (`q·s + o`). Nsight
# Compute's executed instructions by opcode (exp/s46_sass_ops.py) for the paged decode on an int8 cache (issue 45's
# shape, exp/s44_ncu_step.py) and the weight-only matmul at EasyDeL's tiles (int8 col, M 16, `use_best_config`),
# before and after exp/s46_qmm_fma.patch. Run `OUT=$OUT bash exp/s46_next_ncu_fma.sh` (carry `.whl`).
. exp/s28_env.sh
profile() {  # kernel regex, report name, command...
    local kernel=$1 name=$2
    shift 2
    timeout 120 ncu --clock-control none -k "regex:$kernel" -c 1 --section SpeedOfLight --section SourceCounters \
        --import-source no -o "/tmp/$name" "$@" > /dev/null 2>&1
    echo "=== $name"
    ncu -i "/tmp/$name.ncu-rep" --page details 2>&1 | grep -E "Duration|Compute \(SM\) Throughput"
    ncu -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass > "/tmp/$name.csv" 2>&1
    python3 exp/s46_sass_ops.py "/tmp/$name.csv" 14
}
profile ejkernel_paged_attention paged_int8 python3 exp/s44_ncu_step.py int8
profile ejkernel_quantized_matmul qmm_col python3 exp/s46_qmm_step.py col 16 triton best
patch -p1 < exp/s46_qmm_fma.patch > /dev/null
profile ejkernel_quantized_matmul qmm_col_fma python3 exp/s46_qmm_step.py col 16 triton best
patch -R -p1 < exp/s46_qmm_fma.patch > /dev/null
