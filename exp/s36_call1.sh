# Session 36, call 1 (nvidia-h200): session 35's WY-transform kernel (now applied to the working tree) on the GPU:
# the gated-delta-rule GPU tests (dense and ragged); the decode step's parts and tile sweep (exp/s36_gdr_decode.py);
# fla's serving rows (exp/s35_fla_serving.py: its 8 x 2048 prefill beside ours in the same call); then
# `ejkernel bench linear_attention` (serving and training: GDR fwd+bwd against GLA's, issue 42 asks <= 1.2x).
. exp/s28_env.sh
XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 timeout 90 python3 -m pytest -q -m gpu -n 2 -p no:cacheprovider -rfE \
  tests/linear_attention/test_linear_triton.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py \
  -k "delta or mixed" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -6
timeout 120 python3 exp/s36_gdr_decode.py --out "$OUT" 2>&1 | quiet | tail -12
timeout 90 python3 exp/s35_fla_serving.py --out "$OUT" 2>&1 | quiet | tail -8
timeout 280 python3 -m ejkernel.cli bench linear_attention --repeats 10 --out "$OUT" 2>&1 | quiet | tail -30
