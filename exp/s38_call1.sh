# Session 38, call 1 (nvidia-h200): the ragged GDR decode as one kernel (GPU tests, then A/B against session 37's
# two kernels), and the causal_conv1d window forward's tile and eviction sweep.
. exp/s28_env.sh
gpu_tests 150 tests/linear_attention/test_ragged_gated_delta_rule_triton.py
timeout 200 python3 exp/s38_gdr_decode.py --one --out "$OUT" 2>&1 | quiet | tail -12
timeout 230 python3 exp/s38_conv.py --out "$OUT" 2>&1 | quiet | tail -40
