# Session 43, call 2 (nvidia-h200): the whole GPU suite on the session's commit (6 workers, verbose log in $OUT).
OUT=$OUT TEST_TIMEOUT=530 WORKERS=6 tools/gpu-suite
