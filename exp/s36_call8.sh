# Session 36, call 8 (nvidia-h200): the WY transform's pullback in one Triton kernel (with dw = -dU h^T; it replaces
# XLA's chunked products): the gated-delta-rule GPU tests, its forward+backward beside GLA's at 8 and 4 warps
# (exp/s36_gdr_train.py; call 1: 8.15 ms, 1.47x GLA, with the pullback in XLA), and the kernel split.
. exp/s28_env.sh
XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 timeout 80 python3 -m pytest -q -m gpu -n 2 -p no:cacheprovider -rfE \
  tests/linear_attention/test_linear_triton.py -k "delta or mixed" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" \
  | cut -c1-400 | tail -6
timeout 100 python3 exp/s36_gdr_train.py 2>&1 | quiet | tail -5
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 60 python3 exp/kernel_split.py gdr 2>&1 | quiet \
  | grep -v "^\s*0.0[0-4]" | head -22
