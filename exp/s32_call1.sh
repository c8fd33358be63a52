#!/usr/bin/env bash
# Thirty-second session, call 1: what session 31 left unmeasured. The FP8 forward's schedules on causal calls (which
# still take the ping-pong), speculative-decoding batches on the Mosaic GPU prefill tiles against the Triton core
# (`MIN_MEAN_QUERIES`), and the mixed-batch prefill rows (unified's 60x1 row scrolled out last time).
set -u
. exp/s28_env.sh
echo "=== fp8 causal"
timeout 200 python3 exp/s30_fp8_variants.py --stall 100 --causal yes \
    --only "ov bk128 s2,ov-turns bk128 s2,ov bk128 s3,ov bk128 s2 e32,pp bk128 s2 e32" 2>&1 | quiet | grep -v "^ *at " | tail -40
echo "=== spec decode"
timeout 150 python3 exp/s31_spec_decode.py 2>&1 | quiet | tail -30
echo "=== prefill"
timeout $((570 - SECONDS)) python3 exp/s31_prefill.py --stall 100 --only "triton,pallas s2" 2>&1 | quiet | tail -30
