# Prepared in session 58 for the next session (one H200, about 5 minutes; carry [".whl"]), on main: the dense gated
# delta rule's one-pass forward below 256 (batch row, head) programs (`s58_one_pass_rows.py`): if it wins at 128 or 64
# rows, `_delta.one_pass_outputs`'s threshold moves there.
. exp/s28_env.sh
(cd exp && timeout 240 python3 s58_one_pass_rows.py 2>&1 | quiet | tail -6)
# fla's chunk_gla forward stage by stage (CUDA events; its profiler breakdown never printed), beside our forward's
# timeline of session 57 (cumulative 136 us, scores 378, states 713, outputs 441).
(cd exp && timeout 150 python3 s58_fla_gla_forward.py 2>&1 | quiet | tail -4)
