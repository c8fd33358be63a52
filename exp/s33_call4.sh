# Session 33, call 4 (nvidia-h200): the state-space test that failed in call 3's suite, with its traceback; the
# weight-only Mosaic GPU kernel's int8 rows (EasyDeL's layout) against Triton; auto's grouped matmul bench.
. exp/s28_env.sh
timeout 100 python3 -m pytest -q -x -m gpu -p no:cacheprovider --tb=short \
  "tests/state_space/test_ssm_triton.py::test_gpu_v2_triton_matches_xla" 2>&1 | quiet | tail -30
echo "=== quantized matmul int8"
timeout 120 python3 exp/s32_qmm_mosaic.py int8 2>&1 | quiet | tail -14
echo "=== grouped matmul bench"
timeout 170 python3 -m ejkernel.cli bench grouped_matmul --out "$OUT" 2>&1 | quiet | tail -30
