# Session 45, call 1 (nvidia-h200): the SSM GPU test that failed beside five workers in sessions 43 and 44, alone with
# its traceback; issue 45's int8 decode with integer dots (exp/s45_kv8_int.py, modes 0-2, each in its own process);
# Nsight Compute's per-instruction view (SASS, live registers) of the e4m3 and int8 decode kernels.
. exp/s28_env.sh
XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 timeout 150 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --tb=long \
    "tests/state_space/test_ssm_triton.py::test_gpu_v2_triton_matches_xla" > "$OUT/ssm.log" 2>&1
grep -E "PASSED|FAILED|passed|failed|Error|error" "$OUT/ssm.log" | cut -c1-300 | tail -25
for mode in 0 1 2; do
    timeout 120 python3 exp/s45_kv8_int.py $mode 2>&1 | quiet | tail -4
done
for run in "0 e4m3" "0 int8" "1 int8" "2 int8"; do
    set -- $run
    timeout 120 ncu --clock-control none -k regex:ejkernel_paged_attention -c 1 --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section SourceCounters --import-source no \
        -o "$OUT/rep_$1_$2" python3 exp/s45_kv8_int.py $1 step $2 > "$OUT/ncu_$1_$2.txt" 2>&1
    echo "=== ncu mode $1 $2: $(tail -1 "$OUT/ncu_$1_$2.txt" | cut -c1-200)"
    ncu -i "$OUT/rep_$1_$2.ncu-rep" --page details 2>&1 | grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occ"
    ncu -i "$OUT/rep_$1_$2.ncu-rep" --page source --csv --print-source sass > "$OUT/sass_$1_$2.csv" 2>&1
    head -c 300 "$OUT/sass_$1_$2.csv"; echo
done
