# Session 45, call 6 (nvidia-h200): issue 45's int8 decode with p @ v as two int8 dots (exp/s45_split_values.py, each
# way in its own process), and the GPU tests of the paged kernels.
. exp/s28_env.sh
for split in 1 0; do
    timeout 60 python3 exp/s45_split_values.py $split 2>&1 | quiet | tail -4
done
gpu_tests 60 tests/serving_attention/test_paged_kv_scales.py tests/serving_attention/test_paged_triton.py
