# Session 44, call 10 (nvidia-h200): the GPU suite on the tests' new host-drawn inputs (harness.randn by numpy),
# 6 workers, cut at 540 s (the whole suite no longer fits one call; what it reached is in the log).
OUT=$OUT TEST_TIMEOUT=540 WORKERS=6 tools/gpu-suite
grep -cE "PASSED" "$OUT/gpu_tests.log"
