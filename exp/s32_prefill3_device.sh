#!/usr/bin/env bash
# Thirty-second session, prefill helper round three (issue 44): first the GPU tests of the Mosaic GPU prefill tiles
# (today's path, in place, routed by queries: against XLA and the plain-JAX core at the MIXED shapes and a draft
# batch), then `exp/s32_prefill3.py` (both MIXED cases and the draft batches, Triton beside each option; its
# watchdog names a variant that hangs). Arguments go to the experiment (`--hlo`, `--ops unified_attention`,
# `--only "triton,routed in place"`, `--no-spec`); PREFILL_TESTS=0 leaves the tests out.
set -u
. exp/s28_env.sh
if [ "${PREFILL_TESTS:-1}" = 1 ]; then
    gpu_tests 120 tests/serving_attention/test_paged_mosaic_gpu.py
fi
echo "=== prefill round three"
timeout $((280 - SECONDS)) python3 exp/s32_prefill3.py --stall 120 --repeats 10 "$@" 2>&1 | quiet | tail -90
