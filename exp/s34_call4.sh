# Session 34, call 4 (nvidia-h200): the two FP8 grouped-matmul MoE-shape tests that call 2's limit cut short:
# 256-row tiles (session 33's fence: fixed tiles, not spans) and spans at 4 stages, one worker each.
. exp/s28_env.sh
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 timeout 250 python3 -m pytest -v -rfE -m gpu -n 2 -p no:cacheprovider \
  tests/grouped_matmul/test_grouped_matmul_mosaic_fp8.py -k "moe_shape and (tiling4 or spans)" --durations=5 > "$OUT/fp8.log" 2>&1
grep -E "^(FAILED|ERROR)|PASSED|passed|failed|s call|Error" "$OUT/fp8.log" | cut -c1-300 | tail -12
