# Session 57, call 5 (one H200, about 2 minutes; carry [".whl"]): where the gated delta rule's prefill at chunk 64
# (EasyDeL's) spends its time: dense 1.21 ms and ragged 1.79 against 1.07 and 0.97 at chunk 32 in call 4.
. exp/s28_env.sh
(cd exp && timeout 100 python3 s56_gdr_prefill_parts.py --chunk64 2>&1 | quiet | tee "$OUT/prefill_parts.txt" \
    | grep -v "^ *[0-9.]* *[0-9.]* us .*\(case\|scatter\|broadcast\|clamp\|reduce\|and_fusion\)")
