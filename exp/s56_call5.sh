# Session 56, call 5 (one H200, about 2 minutes): the gated delta rule's forward+backward on the new forward-pass
# tiling beside the tiling before, and GLA, in one run (`s56_training.py`).
. exp/s28_env.sh
(cd exp && timeout 150 python3 s56_training.py 2>&1 | quiet | tee "$OUT/training.txt" | tail -6)
