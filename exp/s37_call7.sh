# Session 37, call 7 (nvidia-h200): the decode batch with the modes decided in the readers' kernel: the ragged
# gated delta rule's GPU tests, then the serving bench (call 6: the decode batch at 0.333 ms, 0.784 of copy).
. exp/s28_env.sh
gpu_tests 120 tests/linear_attention/test_ragged_gated_delta_rule_triton.py
timeout 200 python3 -m ejkernel.cli bench linear_attention --part serving --repeats 20 --out "$OUT" 2>&1 | quiet | tail -14
