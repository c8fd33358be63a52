# Session 45, call 3 (nvidia-h200): issue 45's 8-bit decode with the grid's kv heads fastest (the 8 heads of a
# sequence's keys launched together, so that the per-token-head scales' sectors, read by all 8, hit L2), under integer
# dot modes 0-2 (exp/s45_kv8_int.py, each in its own process); Nsight Compute's DRAM throughput and excess sectors.
. exp/s28_env.sh
for mode in 0 0h 1h 2h; do
    timeout 120 python3 exp/s45_kv8_int.py $mode 2>&1 | quiet | tail -4
done
for run in "1h int8" "0h e4m3" "0h bf16"; do
    set -- $run
    timeout 100 ncu --clock-control none -k regex:ejkernel_paged_attention -c 1 --section SpeedOfLight \
        --section Occupancy --section MemoryWorkloadAnalysis --import-source no \
        -o "/tmp/rep_$1_$2" python3 exp/s45_kv8_int.py $1 step $2 > /dev/null 2>&1
    echo "=== ncu mode $1 $2"
    ncu -i "/tmp/rep_$1_$2.ncu-rep" --page details 2>&1 | grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occ|L2 Hit|excessive sectors" | cut -c1-150
done
