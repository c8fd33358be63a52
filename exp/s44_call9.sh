# Session 44, call 9 (nvidia-h200): the 8-bit decode with the value rows read after the softmax (exp/s44_v_late.patch,
# applied between the two runs): timings (exp/s44_kv8.py) and the e4m3 kernel's registers and occupancy (ncu).
. exp/s28_env.sh
for version in before after; do
    [ $version = after ] && patch -p1 < exp/s44_v_late.patch
    echo "=== $version"
    timeout 150 python3 exp/s44_kv8.py 2>&1 | quiet | tail -3
    timeout 100 ncu --clock-control none -k regex:ejkernel_paged_attention -c 1 --section SpeedOfLight \
        --section Occupancy --section LaunchStats python3 exp/s44_ncu_step.py e4m3 2>&1 \
        | grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Block Limit Reg"
done
gpu_tests 150 tests/serving_attention/test_paged_kv_scales.py tests/serving_attention/test_paged_triton.py
