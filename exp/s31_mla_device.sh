#!/usr/bin/env bash
# Thirty-first session, MLA helper: the Mosaic GPU MLA decode kernel (issue 44). Its GPU tests (both schedules
# against XLA at DeepSeek's widths, the Triton kernel's beside them), then the variants beside Triton and a device
# copy (`exp/s31_mla.py`; its watchdog names a variant that hangs), then the op's paged benchmark (`auto` now takes
# the Mosaic GPU kernel on Hopper). Arguments go to the variants script (`--only ...`).
set -u
. exp/s28_env.sh
gpu_tests 200 tests/serving_attention/test_mla_mosaic_gpu.py tests/serving_attention/test_mla_triton.py
echo "=== mla variants"
(cd exp && timeout $((520 - SECONDS)) python3 s31_mla.py --stall 120 "$@" 2>&1 | quiet | tail -40)
echo "=== bench"
timeout $((590 - SECONDS)) python3 -m ejkernel.cli bench mla --cases paged --out "$OUT" 2>&1 | quiet | tail -14
