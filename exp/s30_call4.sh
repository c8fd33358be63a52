#!/usr/bin/env bash
# Thirtieth session, call 4: the ragged gated delta rule's GPU tests and its prefill beside gated_delta_rule.
set -u
. exp/s28_env.sh
gpu_tests 200 tests/linear_attention/test_ragged_gated_delta_rule_triton.py
echo "=== gdr prefill"
(cd exp && timeout $((575 - SECONDS)) python3 s30_gdr_prefill.py 2>&1 | quiet | grep -E "RESULT|PART|rel|WATCHDOG|Error" | cut -c1-220)
