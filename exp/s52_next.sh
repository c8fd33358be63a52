# Prepared in session 52 for the next session (issue 42; not run: the session's device time was spent), about 6
# minutes on an H200; carry `.whl`. Run `OUT=$OUT bash exp/s52_next.sh`. A second call
# (about 5 minutes) may profile the float8 forward by application replay in relaxed mode (session 52: kernel replay
# ended in a segmentation fault, strict application replay found another set of kernels in its 21st pass):
# `KINDS=fp8 NCU_TIMEOUT=280 NCU_EXTRA="--replay-mode application --app-replay-mode relaxed" OUT=$OUT bash
# exp/s52_ncu_forwards.sh`.
# 1. The float8 forward with exp2 on the FMA units for 16 or 32 of each tile's 128 columns: at e4m3's matmul rate the
#    special-function unit's exp2s (one a score, 16 a cycle an SM) take as long as the two matmuls, so shifting some
#    to the FMA units may pay where session 48's 32 columns on the `ov` schedule did not (697 against 752 TFLOP/s).
# 2. Block-sparse attention's forward + backward at 10% density (1.26x density x dense; target 1.10) under Nsight
#    Compute: each of its three kernels' duration, tensor-pipe activity, issue slots and stalls, beside the bf16 dense
#    forward's profile of session 52 (tensor pipe 80% active).
# 3. Why the float8 forward's row sums on the tensor cores (session 48) were wrong on the GPU: session 48's options
#    restored (`exp/s52_fp8_rowsums.patch`), each variant's per-row ratio to the FADD sums (`exp/s52_rowsums_diag.py`).
. exp/s28_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd exp && timeout 240 python3 s30_fp8_variants.py --shape 2,8192,16,128 --shape 1,16384,16,128 --repeats 10 \
    --only "ov-free bk128 s2,ov-free bk128 s2 e16,ov-free bk128 s2 e32,pp bk128 s2,pp bk128 s2 e16" 2>&1 | quiet \
    | tee "$OUT/fp8_exp2_fma.txt" | grep -v compiling | tail -30)
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # (ncu backs up device memory around each kernel replay)
timeout 200 ncu --clock-control none -k regex:mosaic -c 3 --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats -o /tmp/sparse \
    python3 exp/s52_ncu_step.py sparse > "$OUT/ncu_sparse.log" 2>&1
grep -E "PROF|ERROR" "$OUT/ncu_sparse.log" | head -8
ncu -i /tmp/sparse.ncu-rep --page details > "$OUT/details_sparse.txt" 2>&1
grep -E "^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Registers Per|Achieved Occ|Grid Size|Issue Slots Busy|No Eligible|Dynamic Shared" "$OUT/details_sparse.txt"
ncu -i /tmp/sparse.ncu-rep --page raw --csv --metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,gpu__time_duration.sum \
    > "$OUT/raw_sparse.csv" 2>&1
cut -c1-300 "$OUT/raw_sparse.csv" | tail -5
git apply exp/s52_fp8_rowsums.patch && (cd exp && timeout 150 python3 s52_rowsums_diag.py 2>&1 | quiet | tee "$OUT/rowsums_diag.txt" | tail -40)
