# Session 45, call 5 (nvidia-h200): issue 45's 8-bit decode with the 8-bit tiles as their dots' first operand
# (exp/s45_operand_a.py, four combinations, each in its own process), and the registers Nsight Compute reports.
. exp/s28_env.sh
for combo in "0 0" "1 0" "0 1" "1 1"; do
    timeout 110 python3 exp/s45_operand_a.py $combo 2>&1 | quiet | tail -4
done
for run in "0 1 e4m3" "0 1 int8" "1 1 e4m3"; do
    set -- $run
    echo "=== ncu keys as A $1, values as A $2, $3"
    timeout 70 ncu --clock-control none -k regex:ejkernel_paged_attention -c 1 --section SpeedOfLight \
        --section Occupancy --section LaunchStats python3 exp/s45_operand_a.py $1 $2 step $3 2>&1 \
        | grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occ"
done
