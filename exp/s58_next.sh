# Prepared in session 58 for the next session (one H200, about 7 minutes; carry [".whl"]), on main:
# The dense gated delta rule with packed segments (`seg_ids`: its chunk parts in XLA around Triton's state passes, not
# capped at 32) at chunk 32 against 64, forward and forward+backward. Session 58 found 64 10-16% faster for every
# forward without segments outside the one pass (which runs 32 regardless) and the cap makes training run 32: if 64
# does not lose here either, Triton's default chunk for the delta rule (`TritonEngine.delta_chunk`, 32) can become 64.
. exp/s28_env.sh
(cd exp && timeout 100 python3 s58_chunks.py --segments 2>&1 | quiet | tail -8)
(cd exp && timeout 200 python3 s58_chunks.py --segments --train 2>&1 | quiet | tail -5)
# GLA at chunks 16, 32, 64 (its Triton default, 32, rests on an old H100 measurement; fla runs 64).
(cd exp && timeout 200 python3 s58_gla_chunks.py 2>&1 | quiet | tail -3)
