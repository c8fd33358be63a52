# Session 38, call 3 (nvidia-h200): causal_conv1d with SiLU through the approximate tanh and the GDR decode's
# writers loading the slot's tile beside the mode: GPU tests, `ejkernel bench causal_conv1d`, the GDR A/B.
. exp/s28_env.sh
gpu_tests 200 tests/test_causal_conv1d_triton.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py
timeout 150 python3 exp/s38_gdr_decode.py --out "$OUT" 2>&1 | quiet | tail -8
timeout 200 python3 -m ejkernel.cli bench causal_conv1d --repeats 20 --out "$OUT" 2>&1 | quiet | tail -14
