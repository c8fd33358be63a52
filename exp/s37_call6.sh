# Session 37, call 6 (nvidia-h200): the ragged gated delta rule's GPU tests (a decode batch without
# query_start_loc now runs the decode kernels alone, which write the query's dtype), then
# `ejkernel bench linear_attention --part serving`: the decode step with bounds and as a decode batch.
. exp/s28_env.sh
gpu_tests 150 tests/linear_attention/test_ragged_gated_delta_rule_triton.py
timeout 230 python3 -m ejkernel.cli bench linear_attention --part serving --repeats 20 --out "$OUT" 2>&1 | quiet | tail -14
