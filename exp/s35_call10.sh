# Session 35, call 10 (nvidia-h200; not run: the session's device time ran out): the WY transform's kernel on the
# GPU, after `git apply exp/s35_wy_kernel.patch` (written and tested on the CPU in session 35, not on main until it
# passes here): the gated-delta-rule GPU tests (dense and ragged), then `ejkernel bench linear_attention` (serving:
# decode, and the 8 x 2048 prefill beside the dense op, where fla's chunk_gated_delta_rule took 0.946 ms; training:
# the gated delta rule's forward+backward, whose WY transform now runs in the kernel too, its pullback from the
# kernel's inverse in XLA, against GLA's: issue 42 asks <= 1.2x).
. exp/s28_env.sh
XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 timeout 75 python3 -m pytest -q -m gpu -n 2 -p no:cacheprovider -rfE \
  tests/linear_attention/test_linear_triton.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py \
  -k "delta or mixed" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -6
timeout 300 python3 -m ejkernel.cli bench linear_attention --repeats 10 --out "$OUT" 2>&1 | quiet | tail -30
