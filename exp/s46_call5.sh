# Session 46, call 5 (nvidia-h200): the flash-attention part of the GPU suite (calls 3-4 ran the rest), in what
# device time was left.
OUT=$OUT TESTS=tests/flash_attention TEST_TIMEOUT=345 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -25
