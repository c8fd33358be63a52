# Session 58, call 1 (one H200, about 3 minutes; carry [".whl"]): after the dense gated delta rule's in-kernel L2 norm
# (dense prefill 1.09 -> 0.865 ms, the ragged 0.99: now the slower), where the ragged prefill's time goes beside the
# dense one's (device timelines), and fla's prefill in the same call for the ratios.
. exp/s28_env.sh
(cd exp && timeout 120 python3 s56_gdr_prefill_parts.py 2>&1 | quiet > "$OUT/prefill_parts.txt"; \
    grep -v "^ *[0-9.]* *[0-9.]* us .*\(case\|broadcast\|clamp\|and_fusion\)" "$OUT/prefill_parts.txt" | tail -70)
(cd exp && timeout 100 python3 s35_fla_serving.py --out "$OUT" 2>&1 | quiet | tail -8)
