#!/usr/bin/env bash
# Thirty-first session, prefill helper (issue 44): the Mosaic GPU prefill tiles of mixed serving batches. First the
# GPU tests of what they touch (the new tiles at the bench's mixed shapes against XLA; the flash attention and
# block-sparse forwards, whose walk grew `streams`, `live` and `out_rows`; the Triton serving core, whose short pass
# became a function of its own), then `exp/s31_prefill.py` (its watchdog names a variant that hangs). Arguments go
# to the experiment (`--ops unified_attention`, `--only "triton,pallas s2"`); PREFILL_TESTS=0 leaves the tests out.
set -u
. exp/s28_env.sh
if [ "${PREFILL_TESTS:-1}" = 1 ]; then
    gpu_tests 300 tests/serving_attention/test_paged_mosaic_gpu.py tests/serving_attention/test_paged_triton.py \
        tests/flash_attention/test_mosaic_gpu.py tests/sparse_attention/test_blocksparse_mosaic_gpu.py
fi
echo "=== prefill variants"
timeout $((585 - SECONDS)) python3 exp/s31_prefill.py --stall 150 "$@" 2>&1 | quiet | tail -60
