#!/usr/bin/env bash
# Thirty-second session, call 5 (trial merge s32-try5: main + s32-mla3 + s32-prefill3): MLA decode's seesaw schedule
# (timings only; each variant's output checked against Triton's), the prefill tiles' in-place writes and routing by
# sequence (GPU tests, timings on the MIXED cases and draft batches), and the quantized matmul's auto routing.
set -u
. exp/s28_env.sh
echo "=== mla (from $SECONDS s)"
(cd exp && timeout 150 python3 s31_mla.py --stall 60 --repeats 10 --only \
    "mosaic shared s1,mosaic seesaw s1,mosaic seesaw s2,mosaic seesaw s1 ov,mosaic seesaw s1 pf,mosaic shared s1 pf,mosaic seesaw s2 pf" \
    2>&1 | quiet | grep -v compiling | tail -12)
echo "=== prefill tests (from $SECONDS s)"
gpu_tests 90 tests/serving_attention/test_paged_mosaic_gpu.py
cp "$OUT/gpu_tests.log" "$OUT/prefill_tests.log"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 timeout 40 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/quantization/test_quantized_matmul_mosaic_gpu.py -k "auto" 2>&1 | tail -2
echo "=== prefill (from $SECONDS s)"
timeout $((455 - SECONDS)) python3 exp/s32_prefill3.py --stall 90 --repeats 10 2>&1 | quiet | grep -v "compiling\|rel to xla 1\|rel to xla 2\|rel to xla 6" | tail -60
