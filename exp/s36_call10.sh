# Session 36, call 10 (nvidia-h200): the WY pullback kernel after its products moved to the state passes' `matmul`
# (the same TF32 products for bf16 inputs): the gated-delta-rule GPU tests and its forward+backward beside GLA's.
. exp/s28_env.sh
XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 timeout 60 python3 -m pytest -q -m gpu -n 2 -p no:cacheprovider -rfE \
  tests/linear_attention/test_linear_triton.py -k "delta or mixed" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" \
  | cut -c1-400 | tail -6
sed -i 's/    for warps in (4, 2):/    for warps in (4,):/' exp/s36_gdr_train.py
timeout 60 python3 exp/s36_gdr_train.py 2>&1 | quiet | tail -3
