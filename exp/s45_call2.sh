# Session 45, call 2 (nvidia-h200): issue 45's int8 decode with integer dots: the tilings under mode 1 and 2
# (exp/s45_kv8_int.py), and what Nsight Compute says holds modes 1 and 2 and e4m3 (occupancy limits, warp stalls, the
# instructions with the most stall samples: exp/s45_sass_top.py).
. exp/s28_env.sh
for mode in 1 2; do
    timeout 170 python3 exp/s45_kv8_int.py $mode --tilings --narrow 2>&1 | quiet | grep -v "^widen *e4m3" | tail -12
done
for run in "1 int8" "2 int8" "0 e4m3"; do
    set -- $run
    timeout 120 ncu --clock-control none -k regex:ejkernel_paged_attention -c 1 --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section SourceCounters --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --import-source no \
        -o "/tmp/rep_$1_$2" python3 exp/s45_kv8_int.py $1 step $2 > /dev/null 2>&1
    echo "=== ncu mode $1 $2"
    ncu -i "/tmp/rep_$1_$2.ncu-rep" --page details > "$OUT/details_$1_$2.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occ|Theoretical Occ|Block Limit|Shared Memory Per Block|Warp Cycles Per Issued|Issued Warp|No Eligible|Eligible Warps" "$OUT/details_$1_$2.txt"
    ncu -i "/tmp/rep_$1_$2.ncu-rep" --page source --csv --print-source sass > "/tmp/sass_$1_$2.csv" 2>&1
    python3 exp/s45_sass_top.py "/tmp/sass_$1_$2.csv" 25 2>&1 | cut -c1-160
done
