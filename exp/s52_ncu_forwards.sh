# Session 52, calls 3-5 (nvidia-h200): Nsight Compute on the Mosaic GPU flash-attention forwards at 2 x 8192 x 16 x 128,
# non-causal (exp/s52_ncu_step.py): the float8 forward (1.19x cuDNN bf16; target 1.6x) beside our bf16 forward.
# Call 3 listed every kernel unfiltered and failed on the first (XLA had preallocated the memory ncu backs up).
# Per kernel: throughput, pipes, issue slots, warp stalls, and executed instructions and stall samples by opcode.
. exp/s28_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # (ncu backs up device memory around each replay)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
for kind in ${KINDS:-fp8 bf16}; do
    echo "=== $kind"
    timeout ${NCU_TIMEOUT:-150} ncu --clock-control none $NCU_EXTRA -k regex:mosaic -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section InstructionStats --section Occupancy --section LaunchStats --section SourceCounters \
        --section WarpStateStats --section SchedulerStats --import-source no -o "/tmp/fa_$kind" \
        python3 exp/s52_ncu_step.py $kind > "$OUT/ncu_$kind.log" 2>&1
    grep -E "PROF|ERROR" "$OUT/ncu_$kind.log" | head -5
    ncu -i "/tmp/fa_$kind.ncu-rep" --page details > "$OUT/details_$kind.txt" 2>&1
    grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Registers Per|Achieved Occ|Block Limit|Grid Size|Block Size|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Eligible Warps|Executed Ipc|Dynamic Shared" "$OUT/details_$kind.txt"
    ncu -i "/tmp/fa_$kind.ncu-rep" --page raw --csv > "$OUT/raw_$kind.csv" 2>&1
    python3 - "$OUT/raw_$kind.csv" <<'PY' 2>&1 | head -40
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
at = next(i for i, r in enumerate(rows) if "ID" in r[:2])
head, units, vals = rows[at], rows[at + 1], rows[at + 2]
for name, unit, val in zip(head, units, vals):
    keep = ("pipe" in name and "pct_of_peak_sustained_active" in name) or ("warp_issue_stalled" in name and "pct" not in name and "ratio" in name)
    if keep and val not in ("", "0"):
        try:
            if float(val.replace(",", "")) >= (3 if "pipe" in name else 0.05): print(f"{name:90s} {val} {unit}")
        except ValueError: pass
PY
    ncu -i "/tmp/fa_$kind.ncu-rep" --page source --csv --print-source sass > "/tmp/sass_$kind.csv" 2>&1
    cp "/tmp/sass_$kind.csv" "$OUT/"
    python3 exp/s46_sass_ops.py "/tmp/sass_$kind.csv" 26
    python3 exp/s45_sass_top.py "/tmp/sass_$kind.csv" 25 | cut -c1-160 | sed -n 2,30p
done
