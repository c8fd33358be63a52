# Session 46, call 3 (nvidia-h200): the GPU suite but flash attention (whose kernels and tests did not change since
# session 44's suite), then issue 45's weight-only tilings at more programs an SM (exp/s46_qmm_tiles.py).
. exp/s28_env.sh
mapfile -t parts < <(ls -d tests/*/ tests/test_*.py | grep -v -e flash_attention -e __pycache__)
OUT=$OUT TESTS="${parts[*]}" TEST_TIMEOUT=430 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -25
timeout 120 python3 exp/s46_qmm_tiles.py 2>&1 | quiet | tee "$OUT/qmm_tiles.txt"
