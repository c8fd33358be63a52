# Session 46, call 1 (nvidia-h200): session 45's prepared base-2 exponentials A/B in the Triton paged core with the
# paged GPU tests on the patched tree (exp/s45_next_exp2.sh), then issue 45's weight-only matmul under Nsight Compute:
# the read ceiling beside it (exp/s44_read_ceiling.py), and for int8 row and col at M 16 what bounds the Triton kernel
# (throughput sections, occupancy, stalls, and the executed instructions by opcode: exp/s46_sass_ops.py).
. exp/s28_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bash exp/s45_next_exp2.sh
patch -R -p1 < exp/s45_exp2.patch > /dev/null
timeout 100 python3 exp/s44_read_ceiling.py 2>&1 | quiet | tail -9
for layout in col row; do
    timeout 90 ncu --clock-control none -k regex:ejkernel_quantized_matmul -c 1 --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section InstructionStats --section Occupancy --section LaunchStats \
        --section SourceCounters --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        --import-source no -o "/tmp/qmm_$layout" python3 exp/s46_qmm_step.py $layout 16 > /dev/null 2>&1
    echo "=== ncu int8 $layout M 16"
    ncu -i "/tmp/qmm_$layout.ncu-rep" --page details > "$OUT/qmm_details_$layout.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occ|Theoretical Occ|Block Limit|Grid Size|Block Size|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Eligible Warps|Executed Ipc" "$OUT/qmm_details_$layout.txt"
    ncu -i "/tmp/qmm_$layout.ncu-rep" --page raw --csv > "/tmp/raw_$layout.csv" 2>&1
    tr ',' '\n' < "/tmp/raw_$layout.csv" | grep -c . > /dev/null
    python3 - "/tmp/raw_$layout.csv" <<'PY' 2>&1 | head -30
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
at = next(i for i, r in enumerate(rows) if "ID" in r[:2])
head, units, vals = rows[at], rows[at + 1], rows[at + 2]
for name, unit, val in zip(head, units, vals):
    if "pipe" in name and "pct_of_peak_sustained_active" in name and val not in ("", "0"):
        try:
            if float(val.replace(",", "")) >= 5: print(f"{name:90s} {val} {unit}")
        except ValueError: pass
PY
    ncu -i "/tmp/qmm_$layout.ncu-rep" --page source --csv --print-source sass > "/tmp/qmm_sass_$layout.csv" 2>&1
    python3 exp/s46_sass_ops.py "/tmp/qmm_sass_$layout.csv" 22
    python3 exp/s45_sass_top.py "/tmp/qmm_sass_$layout.csv" 12 | cut -c1-150 | tail -14
done
