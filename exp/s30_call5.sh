#!/usr/bin/env bash
# Thirtieth session, call 5: the GPU tests of what changed after call 4 (causal_conv1d Triton-first with the plain-JAX
# backward, the ragged GDR prefill's one path, 8-bit codes as bytes in quantized matmul), then the benches of
# causal_conv1d and the ragged GDR serving rows, then the 8-bit quantized matmul sweep.
set -u
. exp/s28_env.sh
XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 timeout 230 python3 -m pytest -v -rfE -m gpu -n 4 -p no:cacheprovider \
    tests/test_causal_conv1d_triton.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py \
    tests/quantization/test_quantized_matmul_triton.py -k "conv or delta or affine-8 or mxfp8 or nvfp8 or auto_picks" \
    >"$OUT/gpu_tests.log" 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu_tests.log" | grep -v "^E " | sed 's/^\[gw[0-9]\] \[...%\] //' | cut -c1-150 | tail -30
echo "=== bench causal_conv1d"
timeout 100 python3 -m ejkernel.cli bench causal_conv1d --out "$OUT" 2>&1 | quiet | tail -12
echo "=== bench ragged gdr"
timeout 100 python3 -m ejkernel.cli bench linear_attention --part serving --out "$OUT" 2>&1 | quiet | tail -10
echo "=== qmm bytes"
timeout $((585 - SECONDS)) python3 exp/s30_qmm_bytes.py 2>&1 | quiet | tail -40
