# Session 47, call 4 (nvidia-h200): the flash attention GPU tests with windowed inference routed to the Mosaic GPU
# kernel by the heuristic, and the windowed calls of call 2 in the shipped H200 table.
OUT=$OUT TESTS="tests/flash_attention" TEST_TIMEOUT=400 WORKERS=6 bash tools/gpu-suite 2>&1 | tee "$OUT/suite.txt"
