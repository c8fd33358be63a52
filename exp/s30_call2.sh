#!/usr/bin/env bash
# Thirtieth session, call 2: the GPU tests of the files changed since the last full pass (verbose, so a cut-short
# run still names each result), then vLLM's unified attention on 8-bit caches (issue 45's alternative).
set -u
. exp/s28_env.sh
XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 timeout 330 python3 -m pytest -v -rfE -m gpu -n 4 -p no:cacheprovider \
    tests/flash_attention/test_float8.py tests/grouped_matmul/test_grouped_matmul_quantized.py \
    tests/serving_attention/test_paged_kv_scales.py tests/serving_attention/test_paged_triton.py \
    tests/sparse_attention/test_blocksparse_mosaic_gpu.py tests/test_causal_conv1d_triton.py >"$OUT/gpu_tests.log" 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu_tests.log" | grep -v "^E " | cut -c1-200 | tail -40
echo "=== vLLM 8-bit decode"
VLLM_TRITON=.anchors/vllm_triton timeout $((580 - SECONDS)) python3 exp/s29_vllm_kv_quant.py 2>&1 | quiet | tail -8
