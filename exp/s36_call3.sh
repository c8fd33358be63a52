# Session 36, call 3 (nvidia-h200): the WY kernel at 2 warps (call 2: 0.66 ms against 0.82 at 4): GPU tests and the
# prefill's kernel split; the decode step's parts again, with its decode branch called without the op's
# `lax.cond` (exp/s36_gdr_decode.py).
. exp/s28_env.sh
XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 timeout 90 python3 -m pytest -q -m gpu -n 2 -p no:cacheprovider -rfE \
  tests/linear_attention/test_linear_triton.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py \
  -k "delta or mixed" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -6
timeout 120 python3 exp/s36_gdr_decode.py --out "$OUT" 2>&1 | quiet | tail -8
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 100 python3 exp/kernel_split.py gdr_prefill 2>&1 \
  | quiet | grep -v "^\s*0.00" | head -12
