# Session 38, call 7 (nvidia-h200): the GDR decode step taking both column sums of the old tile side by side: GPU
# tests, then the A/B against session 37's kernels.
. exp/s28_env.sh
gpu_tests 150 tests/linear_attention/test_ragged_gated_delta_rule_triton.py
timeout 200 python3 exp/s38_gdr_decode.py --ceiling --out "$OUT" 2>&1 | quiet | tail -10
