# Session 40, call 1 (nvidia-h200): the GPU tests of the Mosaic GPU MXFP4 path (not passed in session 39, whose
# call 7 was cut before pytest named the failure) and of the quantized grouped matmul; the MXFP4 kernel's time at
# the MoE shape in 256 x 128 tiles (half the decoding per output) beside 128 x 256, bf16 and `auto`.
. exp/s28_env.sh
gpu_tests 330 tests/grouped_matmul/test_grouped_matmul_mosaic_mxfp4.py tests/grouped_matmul/test_grouped_matmul_quantized.py
cp "$OUT/gpu_tests.log" "$OUT/gpu_tests_full.log"
timeout 150 python3 exp/s39_mxfp4.py --out "$OUT" --tiles 128x256x3,256x128x3,256x128x2 2>&1 | quiet
