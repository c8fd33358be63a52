#!/usr/bin/env bash
# For the session after the twenty-ninth, after the GPU suite: issue 42's FP8 forward against cuDNN bf16, and
# issue 45's 8-bit decode (our tilings with scales; vLLM's kernel on the same caches). Needs `.anchors/vllm_triton`
# (a copy of ../shared/anchors/vllm_triton) carried with `.whl`.
set -u
. exp/s28_env.sh
echo "=== fp8 flash"
timeout 200 python3 -m ejkernel.cli bench flash_attention --part fp8 --out "$OUT" 2>&1 | quiet | tail -14
echo "=== 8-bit decode sweep"
timeout 200 python3 exp/s29_fp8_sweep.py 2>&1 | quiet | tail -10
echo "=== vLLM 8-bit decode"
VLLM_TRITON=.anchors/vllm_triton timeout 120 python3 exp/s29_vllm_kv_quant.py 2>&1 | quiet | tail -4
