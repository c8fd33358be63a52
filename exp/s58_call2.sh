# Session 58, call 2 (one H200, about 6 minutes; carry [".whl"]):
# 1. The ragged prefill's pass with a static trip count (`s58_ragged_probe.py`): does the loaded count cost the 64 us?
# 2. The dense gated delta rule, Triton, chunk 32 against 64 over shapes, forward then forward+backward
#    (`s58_chunks.py`): should the dense op cap its chunk at 32 as the ragged one does (EasyDeL trains at 64)?
. exp/s28_env.sh
(cd exp && timeout 90 python3 s58_ragged_probe.py 2>&1 | quiet | tail -4)
(cd exp && timeout 100 python3 s58_chunks.py 2>&1 | quiet | tail -8)
(cd exp && timeout 200 python3 s58_chunks.py --train 2>&1 | quiet | tail -5)
