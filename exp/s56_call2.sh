# Session 56, call 2 (one H200, carry `.whl` with fla-core 0.6.0): the gated delta rule prefill's forward, kernel by
# kernel, ours (Triton, chunk 32 and 64, dense and ragged) beside fla's `chunk_gated_delta_rule`.
. exp/s28_env.sh
(cd exp && timeout 240 python3 s56_gdr_prefill_parts.py 2>&1 | quiet | tee "$OUT/gdr_prefill_parts.txt")

