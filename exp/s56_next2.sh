# Prepared in session 56 for the next session's second call, on branch `s56-ragged-inplace` (one H200, about 5
# minutes; carry [".whl"]).
# 1. The ragged prefill's outputs stored at the tokens from its state pass (`s56_fused_ragged.py`), at the serving
#    bench's prefill, a mixed batch and one long sequence, against the branch's landed call.
# 2. The WY transform's variants at chunks 32 and 64 (`s56_wy.py`: the landed kernel at 2 / 4 / 8 warps, two kernels).
# 3. The prefill's kernels on the branch (`s56_gdr_prefill_parts.py`).
# 4. GLA's forward+backward kernels beside fla's `chunk_gla` kernels (`s56_gla_parts.py`; issue 42's GLA row).
. exp/s28_env.sh
(cd exp && timeout 150 python3 s56_fused_ragged.py 2>&1 | quiet | tee "$OUT/fused_ragged.txt" | tail -8)
(cd exp && timeout 150 python3 s56_wy.py 2>&1 | quiet | tee "$OUT/wy.txt" | tail -14)
(cd exp && timeout 80 python3 s56_gdr_prefill_parts.py 2>&1 | quiet | tee "$OUT/gdr_prefill_parts.txt" | grep -v "^ *[0-9.]* *[0-9.]* us .*\(case\|scatter\|broadcast\|clamp\|reduce\|and_fusion\)")
(cd exp && timeout 90 python3 s56_gla_parts.py 2>&1 | quiet | tee "$OUT/gla_parts.txt" | tail -60)
(cd exp && timeout 60 python3 s56_gla_parts.py --fla 2>&1 | quiet | tee "$OUT/gla_parts_fla.txt" | tail -24)
