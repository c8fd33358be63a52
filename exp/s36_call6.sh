# Session 36, call 6 (nvidia-h200): the decode step's readers' kernel at one program per request (exp/s36_gdr_decode.py;
# call 4: op 0.383 ms) and the quantized grouped matmul's new forward default (128, 64, 128, 4, 3): its GPU tests,
# the FP8 x FP8 forward at the new and the old default tiles (exp/s36_qgmm.py --fp8-lhs), then
# `ejkernel bench grouped_matmul --part quantized`.
. exp/s28_env.sh
XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 timeout 60 python3 -m pytest -q -m gpu -n 2 -p no:cacheprovider -rfE \
  tests/linear_attention/test_ragged_gated_delta_rule_triton.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -4
timeout 80 python3 exp/s36_gdr_decode.py --out "$OUT" 2>&1 | quiet | tail -6
timeout 100 python3 exp/s36_qgmm.py --fp8-lhs --out "$OUT/fp8lhs" 2>&1 | quiet | tail -4
timeout 150 python3 -m ejkernel.cli bench grouped_matmul --part quantized --repeats 10 --out "$OUT" 2>&1 | quiet | tail -12
gpu_tests 100 tests/grouped_matmul/test_grouped_matmul_quantized.py
