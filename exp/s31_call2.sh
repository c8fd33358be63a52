#!/usr/bin/env bash
# Thirty-first session, call 2 (on branch s31-nibbles): 4-bit codes as nibble phases (GPU tests, then int4/mxfp4/nf4 at
# the defaults, then the same on main's three quantized-matmul files, for an A/B in one run), the causal_conv1d bench
# (its decode-step row), then the float8 forward's variants timed non-causal.
set -u
. exp/s28_env.sh
gpu_tests 100 tests/quantization/test_quantized_matmul_triton.py -k "affine-4 or mxfp4 or auto_picks"
echo "=== qmm 4-bit, nibble phases"
timeout 60 python3 exp/s30_qmm_bytes.py int4 mxfp4 nf4 --defaults 2>&1 | quiet | tail -7
# exp/s31_main/ held main's three quantized-matmul files at dca8935 (copied over the nibble branch's for the A/B)
for f in exp/s31_main/*.py; do dest=$(basename "$f" .py | sed 's/^src_ejkernel_kernels__triton_/src\/ejkernel\/kernels\/_triton\//; s/quantized_matmul__/quantized_matmul\/_/; s/__decode/\/_decode/'); cp "$f" "$dest.py"; echo "main -> $dest.py"; done
echo "=== qmm 4-bit, main"
timeout 60 python3 exp/s30_qmm_bytes.py int4 mxfp4 nf4 --defaults 2>&1 | quiet | tail -7
echo "=== bench causal_conv1d"
timeout 80 python3 -m ejkernel.cli bench causal_conv1d --out "$OUT" 2>&1 | quiet | tail -14
echo "=== fp8 variants"
timeout $((585 - SECONDS)) python3 exp/s30_fp8_variants.py --stall 100 --causal no 2>&1 | quiet | tail -60
