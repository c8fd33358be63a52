# Session 44, call 7 (nvidia-h200): Nsight Compute on the Triton paged core's decode kernel, bf16 / e4m3 / int8
# caches (exp/s44_ncu_step.py): speed of light, occupancy, warp states, instruction mix, launch.
. exp/s28_env.sh
for dtype in bf16 e4m3 int8; do
    echo "=== $dtype"
    timeout 150 ncu --clock-control none -k regex:ejkernel_paged_attention -c 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis \
        python3 exp/s44_ncu_step.py $dtype > "$OUT/ncu_$dtype.txt" 2>&1
    grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Issued Ipc|Executed Ipc|No Eligible|Warp Cycles Per Issued|Stall|Grid Size|Block Size|Shared Memory Config|Dynamic Shared|Static Shared|ERR|Error" "$OUT/ncu_$dtype.txt" | head -40
done
