# Session 52, call 6 (nvidia-h200): the Mosaic GPU forwards with lazy rescaling, A/B against eager and cuDNN bf16
# (exp/s52_lazy_rescale.py, with exp/s52_lazy_rescale.patch applied: it is reverted on main), then the float8 GPU tests with the lazy float8 forward (the prototype's default).
. exp/s28_env.sh
git apply exp/s52_lazy_rescale.patch || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd exp && timeout 300 python3 s52_lazy_rescale.py 2>&1 | quiet | tee "$OUT/lazy_rescale.txt" | grep -v compiling | tail -40)
[ -n "$NO_TESTS" ] || gpu_tests 200 tests/flash_attention/test_float8.py
