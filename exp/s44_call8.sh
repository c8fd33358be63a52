# Session 44, call 8 (nvidia-h200): the 8-bit decode at 64 keys a step and 2 stages (exp/s44_kv8.py --narrow), and
# Nsight Compute's registers and occupancy of the e4m3 kernel at 64 keys (call 7: 219 registers, 2 blocks an SM).
. exp/s28_env.sh
timeout 200 python3 exp/s44_kv8.py --narrow 2>&1 | quiet | tail -11
for tiling in "64 3 4 2" "64 2 4 2" "128 2 4 2"; do
    echo "=== e4m3 $tiling"
    timeout 100 ncu --clock-control none -k regex:ejkernel_paged_attention -c 1 --section SpeedOfLight \
        --section Occupancy --section LaunchStats python3 exp/s44_ncu_step.py e4m3 $tiling 2>&1 \
        | grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Block Limit Reg|Block Limit Shared|Dynamic Shared"
done
