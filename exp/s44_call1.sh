# Session 44, call 1 (nvidia-h200): issue 45's 8-bit KV decode with int8 codes widened through float16's bits
# (exp/s44_kv8.py), the old hardware conversion in a second process; then the paged kernels' GPU tests.
. exp/s28_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
for flag in "" --old-widen; do
    timeout 150 python3 exp/s44_kv8.py $flag 2>&1 | quiet | tail -4
done
gpu_tests 200 tests/serving_attention/test_paged_kv_scales.py tests/serving_attention/test_paged_triton.py
