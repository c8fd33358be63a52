#!/usr/bin/env bash
# Thirty-first session, call 4 (branch s31-try2: main + the MLA round-two, FP8 grouped-matmul round-two and Mosaic GPU
# prefill helpers' branches): the GPU tests of every kernel changed this session and the 16 tests call 1's suite did
# not reach (node ids in exp/s31_call4_tests.txt), then the MLA schedules, the FP8 grouped
# matmul's switches and the prefill tiles timed.
set -u
. exp/s28_env.sh
mapfile -t TESTS < exp/s31_call4_tests.txt  # (node ids with spaces: one per line)
XLA_PYTHON_CLIENT_MEM_FRACTION=0.15 timeout 280 python3 -m pytest -q -rfE -m gpu -n 6 -p no:cacheprovider "${TESTS[@]}" >"$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-300 | tail -20
echo "=== mla"
(cd exp && timeout 70 python3 s31_mla.py --stall 60 --only "mosaic own,mosaic shared+ov s1,mosaic split s1,mosaic split s2" 2>&1 | quiet | grep -v compiling | tail -8)
echo "=== fp8 gmm"
timeout 90 python3 exp/s31_fp8gmm2.py --stall 60 2>&1 | quiet | grep -v compiling | tail -16
echo "=== prefill"
timeout $((555 - SECONDS)) python3 exp/s31_prefill.py --stall 90 --only "triton,pallas s2,pallas s2 exact,pallas s2 paired" 2>&1 | quiet | grep -v compiling | tail -24
